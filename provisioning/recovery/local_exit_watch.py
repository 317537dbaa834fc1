"""Recovery in about a second for every local instance, whoever started it: one watcher holds a pidfd per process.

The parent's exit notice (``exit_notice.watch``) hears only of the instances its own process started, and only
while that process lives: a worker restarted since, or a short-lived ``manage.py instance start`` /
``local_instances start`` (the demo's instances), leaves its instances to the heartbeat sweep (10-13 s). Linux
gives a pollable descriptor for any process, child or not (``os.pidfd_open``, 5.3+): it becomes readable the
moment the process exits. ``LocalExitWatcher`` keeps one for the agent-host of every local instance meant to run
(marked ``running``, tenant ready or degraded), re-reading that set from PostgreSQL every ``refresh_s`` (1 s), so
an instance started by anyone is watched within a second, and polls them all in one thread. The pid is the one
the driver records (``recorded_host_pids``: the pid file written at the spawn, then the runtime record): for a
sandboxed instance the host's pid as this machine sees it, or the sandbox's until the host has exec'd.

An exit, or a recorded process found gone at first sight (it died while nobody watched), goes through
``exit_notice.instance_dead_notice``, the decision the parent's notice and the pod watcher use: a planned stop,
restart, sleep or release switch marks the instance before signalling it, a recovery marks it ``recovering``,
and a pid already replaced finds the new host present, so none of them starts a recovery. ``recovery_start``
locks the instance row and refuses a second active recovery, so this watcher and the parent's notice never
start two for one exit.

One watcher for the whole fleet, on any number of machines: ``run`` watches only while it holds the leader lease
``local-exit-watch`` (``controlplane.leases.leader_loop``; renewed every ``LEADER_RENEW_S``). A second watcher
stands by and takes over within ``LEADER_LEASE_S`` when the first one dies or is cut off, at once when it stops
cleanly; a watcher whose renewal is refused (deposed) stops watching at once.

What it does not see: hangs (the process lives; the heartbeat timeout stays for those), and processes in another
PID namespace than its own (it runs on the machine that runs the instances, as the local profile does).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import select
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, connections

from controlplane.fds import readable_now
from controlplane.leases.lease import LeaderLease
from controlplane.leases.loop import leader_loop
from provisioning.choices import InstanceStatus, ResourceKind, ResourceStatus
from provisioning.drivers.local_process import is_tenant_process, recorded_host_pids
from provisioning.models import AgentInstance, ProvisionedResource
from provisioning.recovery.exit_notice import instance_dead_notice
from tenants.choices import TenantStatus

__all__ = ["LEASE_NAME", "LocalExitWatcher", "WatchTarget", "local_watch_targets"]

log = logging.getLogger(__name__)

LEASE_NAME = "local-exit-watch"
_MEANT_TO_RUN_TENANT = (TenantStatus.READY, TenantStatus.DEGRADED)


@dataclass(frozen=True)
class WatchTarget:
    """A local instance meant to run, and where its host's pid is recorded (freshest first)."""

    tenant_id: str
    pids: tuple[int, ...]


def local_watch_targets() -> list[WatchTarget]:
    """Every local instance meant to run now: two queries, then one small file read per instance."""
    tenant_ids = [str(t) for t in AgentInstance.objects.filter(
        status=InstanceStatus.RUNNING, tenant__status__in=_MEANT_TO_RUN_TENANT).values_list("tenant_id", flat=True)]
    details: dict[tuple[str, str], dict[str, Any]] = {
        (str(tenant_id), kind): value or {}
        for tenant_id, kind, value in ProvisionedResource.objects.filter(
            tenant_id__in=tenant_ids, kind__in=(ResourceKind.RUNTIME, ResourceKind.VOLUME))
        .exclude(status=ResourceStatus.DELETED).values_list("tenant_id", "kind", "details")}
    return [WatchTarget(tenant_id=tenant_id, pids=tuple(recorded_host_pids(
        str(details.get((tenant_id, ResourceKind.VOLUME), {}).get("path", "")) or None,
        details.get((tenant_id, ResourceKind.RUNTIME)))))
        for tenant_id in tenant_ids]


@dataclass
class _Watched:
    tenant_id: str
    pid: int
    fd: int


class LocalExitWatcher:
    """``run`` until ``stop`` (thread-safe). ``targets`` and ``notice`` are the database's and the recovery's by
    default; ``exclusive=False`` skips the fleet-wide lease (tests that give their own targets); ``lease`` is the
    lease ``local-exit-watch`` with the settings' period by default."""

    def __init__(self, *, refresh_s: float = 1.0, lease: LeaderLease | None = None,
                 verify_grace_s: float = 10.0, exclusive: bool = True,
                 targets: Callable[[], Iterable[WatchTarget]] = local_watch_targets,
                 notice: Callable[..., str] = instance_dead_notice,
                 progress: Callable[[str], None] | None = None) -> None:
        self.refresh_s = refresh_s
        self._lease = lease or LeaderLease(LEASE_NAME)
        # A recorded pid alive but not (yet) showing the tenant's environment: a sandbox still inside execve, or
        # the pid reused after the instance died unwatched. Looked at again each refresh; after this long, gone.
        self.verify_grace_s = verify_grace_s
        self.exclusive = exclusive
        self.targets, self.notice = targets, notice
        self.progress = progress or (lambda message: log.info(message))
        # (tenant id, pid, what the notice did, seconds from the exit's wake-up to the notice's answer)
        self.outcomes: list[tuple[str, int, str, float]] = []
        self.watching: dict[str, int] = {}  # tenant id -> pid watched now (read by tests and the command)
        self.holding = threading.Event()  # set while this watcher holds the lease and watches
        self._stopping = threading.Event()
        self._halt = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # a byte wakes the poll (stop, the lease lost)
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_lock = threading.Lock()
        self._wake_closed = False

    # --- the fleet-wide singleton ------------------------------------------------------------------------

    def run(self) -> None:
        """Watch while holding the lease (standing by while another watcher holds it), until ``stop``."""
        _raise_open_files_limit()
        try:
            if not self.exclusive:
                self._watch()
                return
            leader_loop(self._lease, lambda: _Term(self), stopping=self._stopping,
                        role="local exit watcher", progress=self.progress)
        finally:
            connection.close()
            with self._wake_lock:  # never a byte written to a descriptor number reused since
                self._wake_closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def stop(self) -> None:
        self._stopping.set()
        self._halt.set()
        self._wake()

    def _wake(self) -> None:
        with self._wake_lock, contextlib.suppress(BlockingIOError):
            if not self._wake_closed:
                os.write(self._wake_w, b"x")

    # --- the watch ---------------------------------------------------------------------------------------

    def _watch(self) -> None:
        state = _WatchState(self)
        self.progress(f"watching local instances (a pidfd per agent-host; the set re-read every {self.refresh_s:g} s)")
        self.holding.set()
        next_refresh = 0.0
        try:
            while not self._halt.is_set():
                if time.monotonic() >= next_refresh:
                    try:
                        state.refresh(self.targets())
                    except DatabaseError as exc:
                        self.progress(f"could not read the instances ({type(exc).__name__}); retrying")
                        connection.close()
                    except Exception:  # noqa: BLE001 - out of descriptors, say: logged, the watch goes on
                        log.exception("local exit watch refresh failed", extra={"event": "local_exit_watch_failed"})
                    next_refresh = time.monotonic() + self.refresh_s
                timeout_ms = max(0, int((next_refresh - time.monotonic()) * 1000))
                for fd, _events in state.poller.poll(timeout_ms):
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 64)
                    elif state.fired(fd):
                        next_refresh = 0.0  # what runs now (a replaced host, say) is read at once
        finally:
            self.holding.clear()
            state.close()
            connections.close_all()  # this thread's own

    def _exited(self, tenant_id: str, pid: int, how: str, woke: float) -> None:
        if self.exclusive and not self._lease.held():  # frozen past the lease and resumed: the successor acts
            self.progress(f"tenant {tenant_id}: process {pid} {how}: not acting, the lease is no longer held")
            return
        try:
            result = self.notice(tenant_id, detail=f"the instance process {pid} {how}; noticed by the local exit "
                                 "watcher", log_fields={"event": "local_exit_watch_notice", "pid": pid})
        except Exception:  # noqa: BLE001 - the sweep remains: a notice that cannot act must not stop the watch
            log.exception("local exit notice failed", extra={"event": "local_exit_watch_notice_failed",
                                                             "tenant_id": tenant_id, "pid": pid})
            result = "failed (left to the heartbeat sweep)"
        took = time.monotonic() - woke
        self.outcomes.append((tenant_id, pid, result, took))
        self.progress(f"tenant {tenant_id}: process {pid} {how}: {result} ({took:.3f} s)")


class _Term:
    """One term of leadership: the watch in ``leader_loop``'s thread, halted when the lease is lost or on stop.
    The notices close their thread's connection (``close_old_connections``), which is never the lease's."""

    def __init__(self, watcher: LocalExitWatcher) -> None:
        self.watcher = watcher
        watcher._halt.clear()

    def run(self) -> None:
        self.watcher._watch()

    def stop(self) -> None:
        self.watcher._halt.set()
        self.watcher._wake()


class _WatchState:
    """The watch thread's own descriptors and memory (no other thread touches them)."""

    def __init__(self, watcher: LocalExitWatcher) -> None:
        self.watcher = watcher
        self.poller = select.poll()
        self.poller.register(watcher._wake_r, select.POLLIN)
        self.by_fd: dict[int, _Watched] = {}
        self.by_tenant: dict[str, _Watched] = {}
        self.unverified: dict[tuple[str, int], float] = {}  # (tenant, pid) -> first seen alive, not the tenant's
        self.judged: set[tuple[str, int]] = set()  # exits handed to the notice already: each once

    def refresh(self, targets: Iterable[WatchTarget]) -> None:
        wanted = {t.tenant_id: t for t in targets}
        for watched in list(self.by_tenant.values()):
            if watched.tenant_id not in wanted:  # stopped, asleep, recovering, gone: not meant to run now
                self._unwatch(watched)
                self.watcher.progress(f"tenant {watched.tenant_id}: not meant to run now; process {watched.pid} "
                                      "no longer watched")
        self.unverified = {k: v for k, v in self.unverified.items() if k[0] in wanted}
        self.judged = {k for k in self.judged if k[0] in wanted}
        now = time.monotonic()
        for target in wanted.values():
            self._choose(target, now)

    def fired(self, fd: int) -> bool:
        """The process behind ``fd`` exited: hand it to the notice (once). True if it was one we watch."""
        watched = self.by_fd.get(fd)
        if watched is None:
            return False
        woke = time.monotonic()
        self._unwatch(watched)
        if (watched.tenant_id, watched.pid) in self.judged:
            return False
        self.judged.add((watched.tenant_id, watched.pid))
        self.watcher._exited(watched.tenant_id, watched.pid, "exited", woke)
        return True

    def _choose(self, target: WatchTarget, now: float) -> None:
        """Watch the freshest recorded pid that is the tenant's process, keeping the one watched while it is
        still recorded; none alive: hand the first recorded one to the notice, once."""
        current = self.by_tenant.get(target.tenant_id)
        gone: list[int] = []
        for pid in target.pids:
            if current is not None and current.pid == pid:
                return
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                gone.append(pid)
                continue
            ended = _has_exited(fd)  # a zombie: exited, only not reaped yet
            if ended or is_tenant_process(pid, target.tenant_id):
                if current is not None:
                    self._unwatch(current)
                watched = _Watched(target.tenant_id, pid, fd)
                self.by_fd[fd] = self.by_tenant[target.tenant_id] = watched
                self.watcher.watching[target.tenant_id] = pid
                self.poller.register(fd, select.POLLIN)
                self.unverified.pop((target.tenant_id, pid), None)
                if not ended:
                    self.watcher.progress(f"tenant {target.tenant_id}: watching process {pid}")
                return
            os.close(fd)
            first = self.unverified.setdefault((target.tenant_id, pid), now)
            if now - first < self.watcher.verify_grace_s:
                return  # a sandbox still inside execve shows the tenant's environment in a moment: look again
            gone.append(pid)  # alive all that time as another program: the pid was reused
        if current is not None or not gone or (target.tenant_id, gone[0]) in self.judged:
            return  # still watching what runs, or nothing recorded at all (the sweep remains), or told already
        self.judged.add((target.tenant_id, gone[0]))
        self.watcher._exited(target.tenant_id, gone[0], "was gone when the watcher looked", time.monotonic())

    def _unwatch(self, watched: _Watched) -> None:
        self.by_fd.pop(watched.fd, None)
        if self.by_tenant.get(watched.tenant_id) is watched:
            del self.by_tenant[watched.tenant_id]
            self.watcher.watching.pop(watched.tenant_id, None)
        with contextlib.suppress(KeyError, ValueError):
            self.poller.unregister(watched.fd)
        with contextlib.suppress(OSError):
            os.close(watched.fd)

    def close(self) -> None:
        for watched in list(self.by_fd.values()):
            self._unwatch(watched)


def _has_exited(pidfd: int) -> bool:
    """Whether the process behind ``pidfd`` has exited already."""
    return readable_now(pidfd)


def _raise_open_files_limit() -> None:
    """One descriptor per instance: the soft limit (often 1024) up to the hard one."""
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
