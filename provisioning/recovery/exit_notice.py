"""Recovery in seconds for local instances: the process that started an instance is its parent and learns of
its exit at once, instead of waiting for its heartbeats to go silent (``HEARTBEAT_TIMEOUT_S``, then a sweep).

``watch`` starts one daemon thread per spawned sandbox (or host) that blocks in ``wait()``; when the process
ends, the thread starts the same recovery the sweep would (reason ``dead``), but only for an instance that
is still meant to run: a planned stop, a restart, a suspend or a release switch marks the instance
``stopped`` *before* signalling it (``tenant_actions``), a recovery marks it ``recovering``, and an instance
already back (another host found by the driver) is left alone. ``recovery_start`` refuses a second recovery
of one instance, so the sweep and this notice never both dispatch one.

What it does not cover: an instance whose parent is gone or never stayed (the worker that started it was
restarted; ``manage.py instance start`` or ``local_instances start`` exited after the start). Those are
``local_exit_watch``'s: one long-lived watcher (``manage.py watch_instances``) holds a pidfd for every local
instance meant to run, whoever started it, and calls ``instance_dead_notice`` too; this notice stays, as it
costs nothing, and the two never start two recoveries for one exit. Hangs are left to the heartbeat timeout,
as on Kubernetes, where the kubelet is the parent and pod events play this part (``pod_watch``).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import close_old_connections

from controlplane.errors import Conflict
from provisioning.choices import InstanceStatus
from tenants.actors import SYSTEM
from tenants.choices import TenantStatus

if TYPE_CHECKING:
    from provisioning.drivers.base import TenantSpec

__all__ = ["watch", "on_exit", "instance_dead_notice"]

log = logging.getLogger(__name__)


def watch(proc: subprocess.Popen[bytes], tenant_id: str) -> None:
    """Wait for ``proc`` in a daemon thread and start a recovery if its instance was meant to keep running."""
    if not settings.LOCAL_EXIT_NOTICE:
        return

    def wait() -> None:
        code = proc.wait()  # also reaps it: no zombie left behind by the process that started it
        try:
            on_exit(tenant_id, pid=proc.pid, returncode=code)
        except Exception:  # a notice that cannot act leaves the instance to the heartbeat sweep
            log.exception("exit notice failed", extra={"event": "exit_notice_failed", "tenant_id": tenant_id})

    threading.Thread(target=wait, name=f"exit-notice-{proc.pid}", daemon=True).start()


def on_exit(tenant_id: str, *, pid: int, returncode: int) -> str:
    """What to do now that the instance process ``pid`` has exited; returns what was done (for tests and logs)."""
    return instance_dead_notice(tenant_id, detail=f"the instance process exited (code {returncode}); noticed by "
                                "its parent", log_fields={"event": "exit_notice", "pid": pid, "returncode": returncode})


def instance_dead_notice(tenant_id: str, *, detail: str, log_fields: Mapping[str, Any],
                         present: Callable[[TenantSpec], bool] | None = None) -> str:
    """Someone saw the instance of ``tenant_id`` die (its parent process, the local exit watcher, a pod event):
    start its dead recovery if it is still meant to run and nothing of it runs. Returns what was done (for tests
    and logs).

    The one decision behind every fast notice, so they all leave alone what the sweep would: an instance not
    marked running (a planned stop, restart, suspend or release switch marks it ``stopped`` before disrupting
    it; a recovery marks it ``recovering``), a tenant on its way out, an instance back already (``present``;
    by default the runtime driver's ``present``, where it has one) and one whose recovery is under way. An
    instance put to sleep for idleness is marked ``asleep`` before its stop (provisioning/fleet/sleep.py), so its exit
    is never taken for a death either."""
    from provisioning.drivers.protocols import Capability
    from provisioning.drivers.registry import runtime_driver
    from provisioning.models import AgentInstance
    from provisioning.recovery.sweep import dead_reason, recovery_start
    from provisioning.resources.spec import tenant_spec

    close_old_connections()
    try:
        instance = (AgentInstance.objects.select_related("tenant", "tenant__operator")
                    .filter(tenant_id=tenant_id).first())
        if instance is None:
            return "gone"
        if instance.status != InstanceStatus.RUNNING or instance.tenant.status not in (TenantStatus.READY,
                                                                                        TenantStatus.DEGRADED):
            return f"not meant to run ({instance.status}, tenant {instance.tenant.status})"
        if present is None:
            driver = runtime_driver()
            present = driver.present if Capability.PRESENT in driver.capabilities else None
        if present is not None and present(tenant_spec(instance.tenant)):
            return "another host runs"
        try:
            reason, detail = dead_reason(instance, detail)
            recovery_start(instance=instance, reason=reason, actor=SYSTEM, detail=detail)
        except Conflict:
            return "a recovery is already under way"
        log.warning("instance died; recovery started", extra={**log_fields, "tenant_id": tenant_id})
        return "recovery started"
    finally:
        close_old_connections()
