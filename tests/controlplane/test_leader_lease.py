"""Issue 40, the leader lease (controlplane/leases/lease.py) against the real database: threads racing for it,
renewal, expiry judged by the database's clock, takeover incrementing the epoch, a deposed holder refused."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from controlplane.leases.lease import LeaderLease
from controlplane.leases.models import Lease

pytestmark = pytest.mark.django_db(transaction=True)


def _race(name: str, contenders: int, *, period_s: float = 5.0) -> list[tuple[str, int | None]]:
    """``contenders`` threads, each its own connection, try to take ``name`` at the same instant."""
    start = threading.Barrier(contenders)
    results: list[tuple[str, int | None]] = []
    lock = threading.Lock()

    def contend(i: int) -> None:
        lease = LeaderLease(name, period_s=period_s, renew_s=1.0, holder=f"thread-{i}")
        try:
            start.wait()
            term = lease.take_or_renew()
            with lock:
                results.append((lease.holder, term.epoch if term else None))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_of_threads_racing_for_a_free_lease_exactly_one_takes_it():
    for round_ in range(5):
        results = _race(f"race-{round_}", 8)
        winners = [holder for holder, epoch in results if epoch is not None]
        assert len(results) == 8 and len(winners) == 1, results
        assert Lease.objects.get(name=f"race-{round_}").holder == winners[0]


def test_of_threads_racing_for_an_expired_lease_one_takes_it_with_the_next_epoch():
    old = LeaderLease("expired", period_s=0.5, renew_s=0.1, holder="old")
    assert old.take_or_renew().epoch == 1
    time.sleep(0.7)  # past its period by the database's clock
    results = _race("expired", 6)
    winners = [(holder, epoch) for holder, epoch in results if epoch is not None]
    assert len(winners) == 1 and winners[0][1] == 2, results
    assert old.take_or_renew() is None and not old.held()  # deposed: refused, and it knows at once


def test_renewal_keeps_the_epoch_and_a_live_lease_is_refused_to_others():
    leader = LeaderLease("renew", period_s=2.0, renew_s=0.5, holder="leader")
    other = LeaderLease("renew", period_s=2.0, renew_s=0.5, holder="other")
    assert leader.take_or_renew().epoch == 1
    for _ in range(4):  # renewed past the first period: still epoch 1, never taken
        time.sleep(0.6)
        assert leader.take_or_renew().epoch == 1 and leader.held()
        assert other.take_or_renew() is None and not other.held()
    row = Lease.objects.get(name="renew")
    with connection.cursor() as cur:
        cur.execute("SELECT %s - clock_timestamp()", [row.expires_at])
        remaining = cur.fetchone()[0].total_seconds()
    assert 1.0 < remaining <= 2.0  # set from the database's clock at the last renewal


def test_release_hands_over_at_once_and_the_successor_gets_a_new_epoch():
    first = LeaderLease("release", period_s=30.0, renew_s=1.0, holder="first")
    second = LeaderLease("release", period_s=30.0, renew_s=1.0, holder="second")
    assert first.take_or_renew().epoch == 1
    assert second.take_or_renew() is None
    first.release()
    assert not first.held()
    assert second.take_or_renew().epoch == 2
    first.release()  # releasing what it no longer holds changes nothing
    assert Lease.objects.get(name="release").holder == "second" and second.take_or_renew().epoch == 2


def test_a_holder_stops_counting_itself_leader_before_the_database_lets_anyone_take_over():
    """The holder's own deadline (from before its renewal was sent) passes before the row expires."""
    lease = LeaderLease("deadline", period_s=1.0, renew_s=0.2, holder="me")
    lease.take_or_renew()
    other = LeaderLease("deadline", period_s=1.0, renew_s=0.2, holder="other")
    while lease.held():
        assert other.take_or_renew() is None  # nobody else while the holder still thinks it leads
        time.sleep(0.02)
    assert wait_until(lambda: other.take_or_renew() is not None, 3.0)


def test_renewing_faster_than_half_the_period_is_required():
    with pytest.raises(ValueError, match="under half the period"):
        LeaderLease("bad", period_s=2.0, renew_s=1.5)


def wait_until(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
