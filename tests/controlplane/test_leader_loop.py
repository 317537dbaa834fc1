"""Issue 40, singleton loops with a leader (``controlplane.leases.loop.leader_loop``): real ``manage.py
watch_instances`` processes (local profile) share the lease ``local-exit-watch``: one watches, the other stands
by; the watching one SIGSTOPped past its lease is replaced and, resumed, stops watching; SIGKILLed, it is replaced
within the lease period; SIGTERMed, it hands over at once. In process: a loop whose lease is taken from under it
is stopped at its next renewal, and a loop that ends by itself is started again."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection, connections, transaction

from controlplane.leases.lease import LeaderLease
from controlplane.leases.loop import leader_loop
from controlplane.leases.models import Lease
from provisioning.recovery.local_exit_watch import LEASE_NAME
from tests.conftest import wait_for
from tests.provisioning.test_local_exit_watch import _WatchCommand

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_S, RENEW_S = 3.0, 0.5
ENV = {"LEADER_LEASE_S": str(LEASE_S), "LEADER_RENEW_S": str(RENEW_S)}
HOLDING = f"holding the lease {LEASE_NAME!r}"
STANDING_BY = f"holds the lease {LEASE_NAME!r}: standing by"


def holder_pid() -> int | None:
    row = Lease.objects.filter(name=LEASE_NAME).first()
    return int(row.holder.split(":")[1]) if row else None


def test_one_watch_instances_watches_a_frozen_one_is_deposed_a_killed_one_replaced():
    commands = [_WatchCommand(ENV), _WatchCommand(ENV)]
    try:
        by_pid = {command.proc.pid: command for command in commands}
        wait_for(lambda: holder_pid() in by_pid, timeout=60, what="a watcher holding the lease")
        leader = by_pid[holder_pid()]
        (standby,) = [c for c in commands if c is not leader]
        standby.wait_for_line(STANDING_BY, timeout=60)
        leader.wait_for_line("watching local instances", timeout=10)
        assert HOLDING not in standby.out()

        # SIGSTOP the leader past its lease: the standby takes over; SIGCONT: the old one stops and stands by.
        leader.proc.send_signal(signal.SIGSTOP)
        try:
            standby.wait_for_line(HOLDING, timeout=LEASE_S + 15)
        finally:
            leader.proc.send_signal(signal.SIGCONT)
        assert holder_pid() == standby.proc.pid
        leader.wait_for_line(f"lost the lease {LEASE_NAME!r}", timeout=15)
        wait_for(lambda: leader.out().count(STANDING_BY) == 1, timeout=15, what="the old leader standing by")
        assert holder_pid() == standby.proc.pid

        # SIGKILL the new leader: the first one takes the lease back within the period (and a slow machine's slack).
        killed_at = time.monotonic()
        standby.proc.send_signal(signal.SIGKILL)
        standby.proc.wait(timeout=30)
        wait_for(lambda: leader.out().count(HOLDING) == 2, timeout=LEASE_S + 15, what="the takeover after SIGKILL")
        takeover_s = time.monotonic() - killed_at
        print(f"\nwatch_instances takeover after SIGKILL: {takeover_s:.2f} s (lease {LEASE_S:g} s)")
        assert takeover_s <= LEASE_S + RENEW_S + 5.0
        assert holder_pid() == leader.proc.pid

        # SIGTERM: a clean stop gives the lease back (the row expires now, not a period later).
        assert leader.stop() == 0
        row = Lease.objects.get(name=LEASE_NAME)
        with connection.cursor() as cur:
            cur.execute("SELECT %s <= clock_timestamp()", [row.expires_at])
            assert cur.fetchone()[0]
    finally:
        for command in commands:
            if command.proc.poll() is None:
                command.proc.send_signal(signal.SIGCONT)
            command.stop()


class _Counting:
    """A loop that counts how many of its kind run at once (the most ever seen)."""

    running = 0
    most = 0
    lock = threading.Lock()

    def __init__(self, ends_after_s: float | None = None) -> None:
        self._stop = threading.Event()
        self.ends_after_s = ends_after_s

    def run(self) -> None:
        with _Counting.lock:
            _Counting.running += 1
            _Counting.most = max(_Counting.most, _Counting.running)
        try:
            self._stop.wait(self.ends_after_s)
        finally:
            with _Counting.lock:
                _Counting.running -= 1

    def stop(self) -> None:
        self._stop.set()


def _in_thread(lease: LeaderLease, started: list[_Counting], stopping: threading.Event,
               ends_after_s: float | None = None) -> threading.Thread:
    def start() -> _Counting:
        started.append(_Counting(ends_after_s))
        return started[-1]

    def run() -> None:
        try:
            leader_loop(lease, start, stopping=stopping, role="test loop")
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_loop_whose_lease_is_taken_is_stopped_and_one_that_ends_is_started_again():
    stopping = threading.Event()
    first_started: list[_Counting] = []
    second_started: list[_Counting] = []
    first = LeaderLease("loop", period_s=30.0, renew_s=0.2, holder="first")
    second = LeaderLease("loop", period_s=30.0, renew_s=0.2, holder="second")
    threads = [_in_thread(first, first_started, stopping, ends_after_s=0.5)]
    try:
        wait_for(lambda: len(first_started) >= 3, timeout=20, what="the loop started again after it ended")
        threads.append(_in_thread(second, second_started, stopping))
        time.sleep(1.0)
        assert not second_started and _Counting.most == 1
        # Another holder takes the lease from under the first (as a standby does once first's period has run out
        # unrenewed: first frozen or cut off): first's next renewal is refused and its loop stopped.
        intruder = LeaderLease("loop", period_s=30.0, renew_s=0.2, holder="intruder")
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("UPDATE controlplane_lease SET expires_at = clock_timestamp() WHERE name = 'loop'")
            assert intruder.take_or_renew().epoch == 2
        wait_for(lambda: not first.held() and _Counting.running == 0, timeout=10, what="the deposed loop stopped")
        count = len(first_started)
        time.sleep(1.0)
        assert len(first_started) == count and not second_started  # both standing by
        intruder.release()
        wait_for(lambda: second_started or first_started[count:], timeout=10, what="a standby leading again")
        time.sleep(0.5)
        assert first.held() != second.held()  # one leads (first restarts its loop, which ends every 0.5 s)
        assert _Counting.most == 1  # never two loops at once
    finally:
        stopping.set()
        for thread in threads:
            thread.join(timeout=10)
    assert _Counting.running == 0
