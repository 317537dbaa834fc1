"""Issue 40, beat's fencing on the worker's side (``controlplane.leases.fence``): a real Celery worker given beat
messages forged with the headers ``LeaderScheduler`` sends. The lease ``beat`` changes holder through the real
``LeaderLease`` (epoch e, then e + 1); the job is the dashboard's sample, one ``FleetSample`` row per run.

- a message of the deposed leader's epoch is dropped (logged, not run);
- one of the current epoch runs, and so does a message without the header (not sent by beat);
- an epoch already known to be old is refused without asking the database again.
"""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.celery import app as celery_app
from controlplane.leases.beat import BEAT_LEASE
from controlplane.leases.fence import superseded_by
from controlplane.leases.lease import LeaderLease
from dashboard.models import FleetSample
from tests.conftest import wait_for

SAMPLE_TASK = "dashboard.tasks.history_sample_task"

pytestmark = pytest.mark.django_db(transaction=True)


def _deposed_and_current() -> tuple[LeaderLease, LeaderLease]:
    old = LeaderLease(BEAT_LEASE, holder="machine-1:1:old")
    assert old.take_or_renew() is not None
    old_epoch = old.epoch
    old.release()
    new = LeaderLease(BEAT_LEASE, holder="machine-2:2:new")
    assert new.take_or_renew() is not None and new.epoch == old_epoch + 1  # type: ignore[operator]
    old.term = type(new.term)(old_epoch, 0.0)  # type: ignore[arg-type,misc]  (its epoch, for the forged headers)
    return old, new


def _send_as(lease: LeaderLease | None) -> None:
    headers = {} if lease is None else {"leader_epoch": lease.epoch, "leader_holder": lease.holder,
                                        "leader_sent_at": 0.0}
    celery_app.send_task(SAMPLE_TASK, headers=headers)


def test_a_deposed_leaders_message_is_dropped_the_current_one_runs(worker_factory):  # type: ignore[no-untyped-def]
    # What earlier tests' beats left in the session's queue (no worker read it) is not this test's to count.
    redis.Redis.from_url(str(settings.CELERY_BROKER_URL)).delete(settings.CELERY_TASK_DEFAULT_QUEUE)
    old, new = _deposed_and_current()
    before = FleetSample.objects.count()
    worker = worker_factory()
    _send_as(old)
    _send_as(new)
    _send_as(None)
    wait_for(lambda: worker.log().count(f"Task {SAMPLE_TASK}[") >= 3 and "succeeded" in worker.log(), timeout=120,
             what="the three messages handled")
    wait_for(lambda: FleetSample.objects.count() - before >= 2, timeout=60, what="two samples")
    log = worker.log()
    assert (f"beat fencing: dropped {SAMPLE_TASK}" in log and f"sent by {old.holder} at epoch {old.epoch}" in log
            and f"is at epoch {new.epoch}" in log), log[-3000:]
    assert log.count("beat fencing: dropped") == 1, log[-3000:]  # the old one only
    assert FleetSample.objects.count() - before == 2  # the current leader's and the header-less one, not the old


def test_an_epoch_known_to_be_old_is_refused_without_a_query():
    old, new = _deposed_and_current()
    assert superseded_by(new.epoch) is None  # type: ignore[arg-type]
    with CaptureQueriesContext(connection) as queries:
        assert superseded_by(old.epoch) == new.epoch  # type: ignore[arg-type]
    assert len(queries) == 0
    assert superseded_by(new.epoch + 1) is None  # type: ignore[operator]  (a newer leader than this worker knew)
