"""Operations on a tenant's running instance: start (ensure), stop, kill, submit a task, summarise tasks.

The control plane never imports agent code: tasks are submitted by running the runtime's own
CLI (``python -m agent_runtime.host submit``) with the instance's environment, and task
summaries are read from the tenant's schema with the admin connection (through
``provisioning.resources.runtime_tables``, the control plane's one reader of the runtime's tables).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from django.db import transaction

from controlplane.errors import Conflict, ProvisioningError
from provisioning.choices import InstanceStatus, ResourceKind
from provisioning.drivers.local_process import HOST_MODULE, instance_command, live_host_pid
from provisioning.drivers.pg_admin import tenant_admin_connect
from provisioning.drivers.registry import driver_for
from provisioning.models import AgentInstance
from provisioning.resources import runtime_tables
from provisioning.resources.spec import tenant_spec
from provisioning.workflows.steps import runtime_resource_started
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import Tenant

__all__ = ["instance_start", "instance_kill", "instance_submit_task", "instance_task_summary"]

_INSTANCE_SECRETS = ("db_password", "object_key_b64", "instance_token")


def instance_start(*, tenant: Tenant, actor: Actor) -> dict[str, Any]:
    """Ensure the instance runs (a no-op when it already does); returns the runtime's details.

    Refused while a move of its database has not switched yet: the source is fenced and being copied.
    """
    from provisioning.databases.move import move_in_progress

    move = move_in_progress(tenant)
    if move is not None and move.switched_at is None:
        raise Conflict(f"the tenant's database is being moved to {move.target}: the instance starts after the move")
    driver = driver_for(ResourceKind.RUNTIME)
    ref = driver.ensure(tenant_spec(tenant, with_secrets=_INSTANCE_SECRETS))
    with transaction.atomic():
        AgentInstance.objects.filter(tenant=tenant).update(status=InstanceStatus.RUNNING, status_reason="",
                                                           endpoint=str(ref.details.get("endpoint", "")))
        # Committed with the start: the record names the process running now, never one that died before it.
        runtime_resource_started(tenant, driver_name=driver.name, ref=ref)
        audit_record(actor=actor, action=AuditAction.INSTANCE_START, tenant=tenant,
                     data={"external_id": ref.external_id})
    return {"external_id": ref.external_id, **ref.details}


def instance_kill(*, tenant: Tenant, actor: Actor) -> int:
    """SIGKILL the local instance process (chaos drills and the demo). Returns the killed pid."""
    pid = live_host_pid(tenant_spec(tenant))
    if pid is None:
        raise Conflict("the instance is not running locally")
    os.kill(pid, signal.SIGKILL)
    audit_record(actor=actor, action=AuditAction.INSTANCE_KILL, tenant=tenant, data={"pid": pid})
    return pid


def instance_submit_task(*, tenant: Tenant, kind: str, params: dict[str, Any], actor: Actor) -> str:
    """Enqueue a task in the tenant's own schema through the runtime's CLI; returns the task id."""
    # The CLI is instance code: it runs as the instance does (its uid and sandbox, its environment only).
    argv, env = instance_command(tenant_spec(tenant, with_secrets=_INSTANCE_SECRETS),
                                 [sys.executable, "-m", HOST_MODULE, "submit", "--kind", kind, "--params",
                                  json.dumps(params)])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ProvisioningError(f"task submission failed: {done.stderr.strip()[-300:]}")
    task_id = done.stdout.strip().splitlines()[-1]
    audit_record(actor=actor, action=AuditAction.INSTANCE_SUBMIT_TASK, tenant=tenant,
                 data={"kind": kind, "task": task_id})
    # Straight into the schema, not through the inbox: say so as the inbox does, so an asleep instance wakes
    # for it (and an awake one is not put to sleep before it picks the task up).
    from django.utils import timezone

    from provisioning.fleet.sleep import instance_activity

    instance_activity(tenant=tenant, trigger="submit", accepted_at=timezone.now())
    return task_id


def instance_task_summary(*, tenant: Tenant) -> dict[str, Any]:
    """Counts of the instance's tasks by status and of its boots, read from the tenant's schema."""
    with tenant_admin_connect(tenant, autocommit=True) as conn:
        tasks = runtime_tables.task_counts(conn, tenant.resource_name)
        boots = runtime_tables.boot_count(conn, tenant.resource_name)
    return {"tasks": tasks, "boots": boots}
