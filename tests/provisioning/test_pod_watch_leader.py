"""Issue 40, the pod watcher with a leader (Kubernetes profile): two real ``manage.py watch_instances`` share the
lease ``pod-watch`` against kmock's emulator (tests/k8s_fixtures.py, the fake kubelet keeping each tenant's pod).

Only the leader opens a pod watch (the emulator counts the open streams), so a pod deleted under it starts one
recovery, reported by the leader alone; the leader SIGKILLed, the standby takes the lease within the lease period,
lists and watches, and the next pod deleted starts its recovery once, from the new leader. The local-profile twin
is tests/controlplane/test_leader_loop.py; ``recovery_start`` refusing a second active recovery (two watchers with no
lease) is tests/provisioning/test_pod_watch.py's ``test_two_watchers_start_one_recovery``.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from controlplane.leases.models import Lease
from provisioning.management.commands.watch_instances import POD_WATCH_LEASE
from provisioning.models import RecoveryEvent
from provisioning.recovery.pod_watch import PodWatcher
from tests.conftest import wait_for
from tests.provisioning.test_local_exit_watch import _WatchCommand
from tests.provisioning.test_pod_watch import onboard, pod_path, production, ready_pod, recovery_of  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_S, RENEW_S = 3.0, 0.5  # the session's (tests/conftest.py subprocess_env)
HOLDING = f"holding the lease {POD_WATCH_LEASE!r} (epoch"  # not the banner "... while holding the lease ..."
STANDING_BY = f"holds the lease {POD_WATCH_LEASE!r}: standing by"
WATCHING = "watching agent pods from resourceVersion"


def _holder_pid() -> int | None:
    row = Lease.objects.filter(name=POD_WATCH_LEASE).first()
    return int(row.holder.split(":")[1]) if row else None


def _logs(commands: list[_WatchCommand]) -> str:
    return "\n".join(f"--- watcher {c.proc.pid}:\n{c.out()[-2000:]}" for c in commands)


def _deleted_once(cluster, tenant, ns: str, leader: _WatchCommand, standby: _WatchCommand) -> float:  # type: ignore[no-untyped-def]
    """Delete the tenant's pod: one recovery, started and reported by the leader only; seconds to the recovery."""
    from django.utils import timezone

    deleted_at = timezone.now()
    cluster.http("DELETE", pod_path(ns))
    event = recovery_of(tenant, timeout=10)
    leader.wait_for_line(f"tenant {tenant.pk}: its pod was deleted", timeout=10)
    time.sleep(1.0)  # room for a second watcher's notice, were there one
    assert RecoveryEvent.objects.filter(tenant=tenant).count() == 1
    assert str(tenant.pk) not in standby.out()
    return (event.detected_at - deleted_at).total_seconds()


def test_only_the_leading_watch_instances_watches_pods_and_a_killed_one_is_replaced(  # type: ignore[no-untyped-def]
        production, operator, settings):  # noqa: F811 (fixture)
    cluster = production
    first, first_ns = onboard(operator, "pwl-first")
    second, second_ns = onboard(operator, "pwl-second")
    ready_pod(cluster, first_ns)
    ready_pod(cluster, second_ns)
    env = {"PROVISIONING_PROFILE": "kubernetes", "KUBERNETES_KUBECONFIG": settings.KUBERNETES_KUBECONFIG,
           "KUBERNETES_IN_CLUSTER": "false", "LEADER_LEASE_S": str(LEASE_S), "LEADER_RENEW_S": str(RENEW_S)}
    commands = [_WatchCommand(env), _WatchCommand(env)]
    try:
        by_pid = {command.proc.pid: command for command in commands}
        wait_for(lambda: _holder_pid() in by_pid, timeout=60, what="a watcher holding the lease")
        leader = by_pid[_holder_pid()]  # type: ignore[index]
        (standby,) = [c for c in commands if c is not leader]
        leader.wait_for_line(WATCHING, timeout=30)
        standby.wait_for_line(STANDING_BY, timeout=30)
        time.sleep(1.0)
        assert cluster.pod_watch_count() == 1  # the leader's stream only
        assert WATCHING not in standby.out()

        cluster.kubelet.boot_s = 30.0  # replacements come at once but stay unready: no event but the deletion's
        first_s = _deleted_once(cluster, first, first_ns, leader, standby)

        # The leader SIGKILLed: the standby takes the lease within the period, lists, and watches.
        assert _holder_pid() == leader.proc.pid, _logs(commands)  # it led throughout
        assert HOLDING not in standby.out(), _logs(commands)
        killed_at = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)
        leader.proc.wait(timeout=30)
        standby.wait_for_line(HOLDING, timeout=LEASE_S + 15)
        takeover_s = time.monotonic() - killed_at
        standby.wait_for_line(WATCHING, timeout=30)
        watching_s = time.monotonic() - killed_at
        assert _holder_pid() == standby.proc.pid, _logs(commands)
        assert takeover_s <= LEASE_S + RENEW_S + 5.0, takeover_s
        wait_for(lambda: cluster.pod_watch_count() == 1, timeout=15, what="one pod watch open (the new leader's)")

        second_s = _deleted_once(cluster, second, second_ns, standby, leader)
        # The first tenant's replacement pod, listed by the new leader, starts nothing more: it is recovering.
        assert RecoveryEvent.objects.filter(tenant=first).count() == 1
        print(f"\npod watch leader: recovery {first_s:.3f} s after a deletion; leader SIGKILLed -> standby holding "
              f"the lease in {takeover_s:.2f} s, watching in {watching_s:.2f} s (lease {LEASE_S:g} s, renew "
              f"{RENEW_S:g} s); then recovery {second_s:.3f} s after a deletion")
        assert first_s < 2.0 and second_s < 2.0
        assert standby.stop() == 0
    except BaseException:
        print(_logs(commands))
        raise
    finally:
        for command in commands:
            command.stop()


def test_a_watcher_stopped_during_its_list_opens_no_watch(production):  # type: ignore[no-untyped-def]  # noqa: F811
    """A leader deposed while its fresh watcher lists (``leader_loop`` stops it, then joins its thread) must not go on
    to open a watch: ``stop`` found no stream to shut, so the thread would block on it until the next pod event or
    ``--timeout-s`` (300 s), and the process could neither lead again nor stop."""
    cluster = production
    watcher: PodWatcher | None = None

    def progress(message: str) -> None:
        if message.startswith("listed") and watcher is not None:
            watcher.stop()  # as the lease thread does, at the list's last moment

    watcher = PodWatcher(timeout_s=30, progress=progress)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    thread.join(5)
    try:
        assert not thread.is_alive(), "the stopped watcher opened a watch and blocks on it"
        assert watcher.relists == 1 and cluster.pod_watch_count() == 0
    finally:
        watcher.stop()
        thread.join(35)
