"""Process health on the staff dashboard (issue 37): web, worker, beat and broker on the overview, a real worker
shown down once its heartbeat stops, and a "running" instance whose heartbeat is stale never shown as running in
the tenants list."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from provisioning.choices import InstanceStatus
from provisioning.models import AgentInstance
from tenants.models import Tenant

from .conftest import wait_for


def _staff() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("staff-health", password="x" * 20, is_staff=True))
    return client


def _service(body: str, name: str) -> str:
    """The overview's class for one service's stat ("ok" or "bad"), "" when it is not shown."""
    found = re.search(rf'class="stat (ok|bad)" data-testid="service-{name}"', body)
    return found.group(1) if found else ""


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_is_up_on_the_overview_and_down_once_it_is_killed(worker_factory, settings):
    settings.SERVICE_HEARTBEAT_TIMEOUT_S = 3.0
    staff = _staff()
    worker = worker_factory(SERVICE_HEARTBEAT_INTERVAL_S="0.5")
    wait_for(lambda: _service(staff.get("/dashboard/live").content.decode(), "worker") == "ok", timeout=60,
             what="the worker's first heartbeat")
    body = staff.get("/dashboard/").content.decode()
    assert _service(body, "web") == "ok" and _service(body, "broker") == "ok", body[:3000]
    pid = worker.proc.pid
    assert f"pid {pid}" in body

    worker.kill()  # SIGKILL: no clean stop removes its record; only the heartbeat's age tells
    wait_for(lambda: _service(staff.get("/dashboard/live").content.decode(), "worker") == "bad", timeout=15,
             what="the worker shown down")
    body = staff.get("/dashboard/").content.decode()
    assert 'data-testid="control-plane-down"' in body and f"the worker is down (no heartbeat from pid {pid}" in body


@pytest.mark.django_db
def test_a_running_instance_with_a_stale_heartbeat_is_not_shown_running(operator):
    now = timezone.now()
    for slug, seen in (("fresh", now), ("dead", now - timedelta(hours=1))):
        tenant = Tenant.objects.create(operator=operator, slug=slug, name=slug.title(), status="ready")
        AgentInstance.objects.create(tenant=tenant, status=InstanceStatus.RUNNING, last_heartbeat_at=seen)
    body = _staff().get("/dashboard/tenants/").content.decode()
    cells = dict(re.findall(r'>(fresh|dead)</a>.*?data-testid="tenant-instance">(.*?)</td>', body, re.S))
    assert 'class="badge s-running">running<' in cells["fresh"]
    assert "running" not in cells["dead"] and 'class="badge s-stale"' in cells["dead"], cells["dead"]
    assert re.search(r"no heartbeat for 3[56]\d\d s", cells["dead"]), cells["dead"]
