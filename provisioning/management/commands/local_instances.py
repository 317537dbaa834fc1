"""``manage.py local_instances stop|start``: a planned stop or start of every local instance (``make stop``/``run``).

A planned stop is recorded as what it is: the instance is marked ``stopped`` (the recovery sweep only looks
at running ones) before its process gets SIGTERM and its heartbeat is forgotten once it has exited, so the
sweep never counts it as dead or hung, and ``start`` brings back exactly the instances stopped that way.
Without this, every instance after ``make stop`` / ``make run`` showed up as a "dead" recovery.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from controlplane.errors import ApplicationError
from provisioning.choices import InstanceStatus
from provisioning.fleet.actions import instance_stop_planned
from provisioning.fleet.instances import instance_start
from provisioning.models import AgentInstance
from tenants.actors import Actor
from tenants.choices import TenantStatus

PLANNED = "stopped on purpose (manage.py local_instances stop)"


class Command(BaseCommand):
    help = "Stop (planned, not a failure) or start again every local instance."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["stop", "start"])

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        actor = Actor(kind="system", label=f"manage.py local_instances {action}")
        if action == "stop":
            self._stop(actor)
        else:
            self._start(actor)

    def _stop(self, actor: Actor) -> None:
        for instance in AgentInstance.objects.select_related("tenant").filter(status=InstanceStatus.RUNNING):
            instance_stop_planned(tenant=instance.tenant, actor=actor, reason=PLANNED)
            self.stdout.write(f"  instance {instance.tenant.slug} stopped (planned)")

    def _start(self, actor: Actor) -> None:
        stopped = AgentInstance.objects.select_related("tenant").filter(
            status=InstanceStatus.STOPPED, status_reason=PLANNED,
            tenant__status__in=(TenantStatus.READY, TenantStatus.DEGRADED))
        for instance in stopped:
            try:
                instance_start(tenant=instance.tenant, actor=actor)
            except ApplicationError as exc:
                self.stderr.write(f"  instance {instance.tenant.slug} did not start: {exc.detail}")
                continue
            self.stdout.write(f"  instance {instance.tenant.slug} started")
