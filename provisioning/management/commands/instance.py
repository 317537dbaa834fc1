"""``manage.py instance start|stop|kill|submit|tasks TENANT``: staff operations on one tenant's instance.

``stop`` is a planned stop (``tenant_actions.instance_stop_planned``: marked ``stopped`` before its SIGTERM, so
neither the exit watcher nor the sweep takes it for a death); ``start`` brings it back; ``kill`` is a SIGKILL
(a chaos drill: recovered like any death).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.errors import ApplicationError
from provisioning.fleet.actions import instance_stop_planned
from provisioning.fleet.instances import instance_kill, instance_start, instance_submit_task, instance_task_summary
from tenants.actors import Actor
from tenants.models import Tenant


class Command(BaseCommand):
    help = ("Start, stop (planned: not a recovery), kill (chaos drill), submit a task to, or summarise the tasks of "
            "a tenant's instance.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "kill", "submit", "tasks"])
        parser.add_argument("tenant", help="tenant id, or OPERATOR/SLUG")
        parser.add_argument("--kind", default="demo")
        parser.add_argument("--params", default="{}", help="JSON object of task parameters")

    def handle(self, *args: Any, action: str, tenant: str, kind: str, params: str, **options: Any) -> None:
        if "/" in tenant:
            op, slug = tenant.split("/", 1)
            found = Tenant.objects.exclude(status="deleted").filter(operator__slug=op, slug=slug).first()
        else:
            found = Tenant.objects.filter(pk=tenant).first()
        if found is None:
            raise CommandError(f"no tenant {tenant!r}")
        actor = Actor(kind="system", label=f"manage.py instance {action}")
        try:
            if action == "start":
                out: object = instance_start(tenant=found, actor=actor)
            elif action == "stop":
                instance_stop_planned(tenant=found, actor=actor, reason="stopped on purpose (manage.py instance stop)")
                out = {"stopped": True}
            elif action == "kill":
                out = {"killed_pid": instance_kill(tenant=found, actor=actor)}
            elif action == "submit":
                out = {"task": instance_submit_task(tenant=found, kind=kind, params=json.loads(params), actor=actor)}
            else:
                out = instance_task_summary(tenant=found)
        except ApplicationError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(json.dumps(out, default=str))
