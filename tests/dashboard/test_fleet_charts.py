"""Issue 17 (staff screens, pictures): heartbeat age and time to recover per tenant, fleet status over time.

The charts are server-side SVG, read back here as XML: a value must land where its number says, a hole in
the samples must show as a hole, and no script or external asset may appear. The samples are written by
the same service beat runs every minute, on a real worker, against real PostgreSQL and Redis.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from controlplane.periodic import periodic_jobs_sync
from dashboard.charts import HEIGHT, LEGEND_H, PAD, WIDTH, bar_chart, line_chart
from dashboard.models import FleetSample, HeartbeatSample
from dashboard.sampling import history_sample, samples_prune
from dashboard.tasks import history_sample_task
from provisioning.choices import InstanceStatus, RecoveryOutcome
from provisioning.models import AgentInstance, RecoveryEvent
from provisioning.recovery.heartbeats import heartbeat_store
from tenants.models import Tenant
from tests.conftest import wait_for

SVG = "{http://www.w3.org/2000/svg}"
TOP_Y, BASE_Y = PAD + LEGEND_H, HEIGHT + LEGEND_H - 28  # the plot area of a line chart


def _svg(markup: str) -> ET.Element:
    root = ET.fromstring(markup)  # noqa: S314 - our own markup, parsed to check it
    assert root.tag == f"{SVG}svg"
    return root


def _points(element: ET.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in element.attrib["points"].split())]


def _no_script_or_external(markup: str) -> None:
    lowered = markup.lower()
    assert "<script" not in lowered and "href" not in lowered and "url(" not in lowered
    assert not re.search(r"\son[a-z]+\s*=", lowered)  # no event handler attributes either


# --- the drawing ------------------------------------------------------------------------------------------


def test_a_line_lands_where_its_values_say_and_breaks_at_holes():
    start = timezone.now().replace(microsecond=0) - timedelta(hours=1)
    times = [start + timedelta(minutes=m) for m in (0, 1, 2, 30, 31, 59, 60)]
    ages = [0.0, 5.0, 10.0, None, 2.5, 3.0, 3.0]
    markup = line_chart(times, [("heartbeat age", ages)], start=start, end=start + timedelta(hours=1), unit=" s",
                        gap_s=180, title="Heartbeat <age>", chart_id="hb")
    _no_script_or_external(markup)
    root = _svg(markup)
    assert root.find(f"{SVG}title").text == "Heartbeat <age>"  # escaped in the markup, read back as text
    assert root.attrib["aria-labelledby"] == "hb-title"
    lines = root.findall(f"{SVG}polyline")
    # 0-2 min is one run; None at 30 min breaks it; 31 and 59 min are too far apart (gap 180 s): three runs.
    assert [len(_points(line)) for line in lines] == [3, 2]
    assert len(root.findall(f"{SVG}circle")) == 1  # the lone sample at 31 min
    first = _points(lines[0])
    assert first[0] == (PAD, BASE_Y)  # 0 s at the window's start: bottom left
    assert first[2] == (pytest.approx(PAD + (WIDTH - 2 * PAD) * 2 / 60, abs=0.1), TOP_Y)  # the max at the top
    assert _points(lines[1])[-1][0] == WIDTH - PAD  # the last sample at the window's end
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "Heartbeat <age> (max 10 s)" in texts and "heartbeat age 3 s" in texts  # caption, legend (latest)
    assert root.find(f"{SVG}desc").text == "heartbeat age: latest 3 s"


def test_stacked_areas_add_up_and_are_coloured_by_status():
    start = timezone.now().replace(microsecond=0)
    times = [start, start + timedelta(minutes=1)]
    markup = line_chart(times, [("healthy", [3.0, 2.0]), ("recovering", [1.0, 2.0])], start=start,
                        end=times[-1], stacked=True, title="Fleet")
    root = _svg(markup)
    healthy, recovering = root.findall(f"{SVG}polygon")
    assert "k-healthy" in healthy.attrib["class"] and "k-recovering" in recovering.attrib["class"]
    # The recovering band sits on the healthy one: its top edge is at the total (4 = the top of the plot).
    top_edge = _points(recovering)[:2]
    assert [y for _, y in top_edge] == [TOP_Y, TOP_Y]
    assert [y for _, y in _points(healthy)[:2]] == [pytest.approx(BASE_Y - (BASE_Y - TOP_Y) * 3 / 4),
                                                    pytest.approx(BASE_Y - (BASE_Y - TOP_Y) * 2 / 4)]
    assert "Fleet (max 4)" in [t.text for t in root.iter(f"{SVG}text")]


def test_two_charts_on_one_page_have_their_own_title_ids():
    a = _svg(bar_chart([("x", 1.0)], title="A", chart_id="ttr-chart"))
    b = _svg(line_chart([], [("y", [])], start=timezone.now(), end=timezone.now(), title="B", chart_id="hb"))
    assert a.attrib["aria-labelledby"] != b.attrib["aria-labelledby"]


# --- the samples ------------------------------------------------------------------------------------------


def _tenant(operator, slug: str, status: str, *, beat_age_s: float | None) -> Tenant:  # type: ignore[no-untyped-def]
    tenant = Tenant.objects.create(operator=operator, slug=slug, name=slug, status="ready")
    seen = timezone.now() - timedelta(seconds=beat_age_s) if beat_age_s is not None else None
    AgentInstance.objects.create(tenant=tenant, status=status, last_heartbeat_at=seen)
    return tenant


@pytest.mark.django_db
def test_the_sampler_records_each_instances_heartbeat_age_and_the_fleet_and_prunes(operator, settings):
    healthy = _tenant(operator, "fresh", InstanceStatus.RUNNING, beat_age_s=5)
    _tenant(operator, "silent", InstanceStatus.RUNNING, beat_age_s=settings.DASHBOARD_HEARTBEAT_STALE_S + 30)
    _tenant(operator, "mending", InstanceStatus.RECOVERING, beat_age_s=None)
    _tenant(operator, "jailed", InstanceStatus.QUARANTINED, beat_age_s=900)
    gone = _tenant(operator, "gone", InstanceStatus.STOPPED, beat_age_s=10)
    Tenant.objects.filter(pk=gone.pk).update(status="deleted")
    # The live store wins over the synced row, as on the tenant page: this instance beat 1 s ago.
    live = AgentInstance.objects.get(tenant=healthy)
    heartbeat_store().record(str(live.pk), {"status": "idle"}, now=timezone.now().timestamp() - 1)
    settings.DASHBOARD_SAMPLE_RETENTION_DAYS = 2
    old = timezone.now() - timedelta(days=3)
    FleetSample.objects.create(taken_at=old, counts={"healthy": 9})
    HeartbeatSample.objects.create(tenant=healthy, taken_at=old, age_s=1.0, label="healthy")
    kept = HeartbeatSample.objects.create(tenant=healthy, taken_at=timezone.now() - timedelta(days=1), age_s=2.0,
                                          label="healthy")

    result = history_sample()
    assert result.ran and result.instances == 4 and result.pruned == 2
    fleet = FleetSample.objects.get()
    assert fleet.counts == {"healthy": 1, "stale": 1, "recovering": 1, "quarantined": 1}
    ages = {s.tenant.slug: (s.age_s, s.label) for s in HeartbeatSample.objects.exclude(pk=kept.pk)}
    assert set(ages) == {"fresh", "silent", "mending", "jailed"}
    assert ages["fresh"][0] == pytest.approx(1, abs=1) and ages["fresh"][1] == "healthy"
    assert ages["silent"][0] == pytest.approx(settings.DASHBOARD_HEARTBEAT_STALE_S + 30, abs=2)
    assert ages["silent"][1] == "stale"
    assert ages["mending"] == (None, "recovering")  # never beat: no age, not 0
    assert samples_prune() == 0  # nothing left past the retention
    heartbeat_store().forget(str(live.pk))


@pytest.mark.django_db
def test_the_sampler_is_registered_with_beat_every_minute():
    periodic_jobs_sync()
    task = PeriodicTask.objects.get(task="dashboard.tasks.history_sample_task")
    assert task.interval.every == 60 and task.interval.period == "seconds" and task.enabled


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_samples_the_fleet_and_prunes_past_the_retention(worker_factory):
    expired = FleetSample.objects.create(taken_at=timezone.now() - timedelta(days=8), counts={"healthy": 1})
    worker = worker_factory()
    history_sample_task.delay()
    wait_for(lambda: FleetSample.objects.exclude(pk=expired.pk).exists(), timeout=60,
             what=f"a fleet sample (worker log: {worker.log_path})")
    # The sample commits before the prune runs in the same task: wait for the task's end, not for its sample.
    wait_for(lambda: not FleetSample.objects.filter(pk=expired.pk).exists(), timeout=30,
             what=f"the expired sample pruned past the default 7 days (worker log: {worker.log_path})")
    assert FleetSample.objects.exclude(pk=expired.pk).count() >= 1


# --- the pages --------------------------------------------------------------------------------------------


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("charts-staff", password="pw-123456789", is_staff=True))
    return client


def _figure(html: str, testid: str) -> str:
    return html.split(f'data-testid="{testid}"', 1)[1].split("</figure>", 1)[0]


@pytest.mark.django_db
def test_fleet_page_draws_the_samples_and_lists_them(staff):
    now = timezone.now()
    for minutes, counts in ((50, {"healthy": 3}), (40, {"healthy": 2, "recovering": 1}), (5, {"healthy": 3})):
        FleetSample.objects.create(taken_at=now - timedelta(minutes=minutes), counts=counts)
    FleetSample.objects.create(taken_at=now - timedelta(hours=3), counts={"quarantined": 7})  # outside 1h
    html = staff.get("/dashboard/fleet/?window=1h").content.decode()
    figure = _figure(html, "fleet-chart")
    _no_script_or_external(figure.split("<svg", 1)[1].split("</svg>", 1)[0])
    svg = _svg("<svg" + figure.split("<svg", 1)[1].split("</svg>", 1)[0] + "</svg>")
    bands = {p.attrib["class"].split()[-1] for p in svg.iter(f"{SVG}polygon")}
    assert bands == {"k-healthy", "k-recovering"}  # quarantined was 3 h ago: not in this window
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    # Nothing sampled in the window's first 10 min: the axis starts at the first sample and says so.
    assert any(t.startswith("Instances by status, last 1h (max 3; sampled since ") for t in texts)
    assert "recovering 0" in texts
    # The 10 latest samples are listed too, window or not.
    table = html.split('data-testid="fleet-samples"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == 5  # header + 4 samples
    assert 'aria-current="page"' in html.split('aria-label="Time window"', 1)[1].split("</nav>", 1)[0]
    # An unknown window is the default, not an error.
    assert "last 24h" in staff.get("/dashboard/fleet/?window=1y;drop").content.decode()


@pytest.mark.django_db
def test_fleet_chart_on_the_overview_and_its_empty_state(staff):
    assert 'data-testid="fleet-chart-empty"' in staff.get("/dashboard/").content.decode()
    FleetSample.objects.create(taken_at=timezone.now() - timedelta(minutes=2), counts={"healthy": 1})
    FleetSample.objects.create(taken_at=timezone.now() - timedelta(minutes=1), counts={"healthy": 1})
    html = staff.get("/dashboard/").content.decode()
    figure = _figure(html, "fleet-chart")
    assert "<polygon" in figure and 'href="/dashboard/fleet/"' in figure


@pytest.mark.django_db
def test_tenant_page_draws_heartbeat_age_and_time_to_recover(staff, operator):
    tenant = _tenant(operator, "charted", InstanceStatus.RUNNING, beat_age_s=3)
    instance = AgentInstance.objects.get(tenant=tenant)
    now = timezone.now()
    for minutes, age in ((30, 4.0), (29, 42.0), (28, 3.0)):
        HeartbeatSample.objects.create(tenant=tenant, taken_at=now - timedelta(minutes=minutes), age_s=age,
                                       label="healthy")
    detected = now - timedelta(minutes=29)
    RecoveryEvent.objects.create(tenant=tenant, instance=instance, reason="dead", detected_at=detected,
                                 resumed_at=detected + timedelta(seconds=12.5), outcome=RecoveryOutcome.SUCCEEDED)
    RecoveryEvent.objects.create(tenant=tenant, instance=instance, reason="hung", detected_at=now,
                                 outcome=RecoveryOutcome.FAILED)
    html = staff.get(f"/dashboard/tenants/{tenant.pk}/?history=1h").content.decode()
    heartbeat = _figure(html, "heartbeat-chart")
    svg = _svg("<svg" + heartbeat.split("<svg", 1)[1].split("</svg>", 1)[0] + "</svg>")
    (line,) = svg.findall(f"{SVG}polyline")
    ys = [y for _, y in _points(line)]
    assert len(ys) == 3 and ys[1] == TOP_Y and ys[0] > TOP_Y  # the 42 s spike is the top
    assert any(t.text.startswith("Heartbeat age, last 1h (max 42 s; sampled since ")
               for t in svg.iter(f"{SVG}text"))
    ttr = _figure(html, "ttr-chart")
    assert "12.5 s</title>" in ttr and "not resumed</title>" in ttr  # the failed one is an empty slot
    _no_script_or_external(heartbeat + ttr)
    other = _tenant(operator, "quiet", InstanceStatus.RUNNING, beat_age_s=1)
    quiet = staff.get(f"/dashboard/tenants/{other.pk}/").content.decode()
    assert "No heartbeat samples in the last 24h yet" in quiet and "No recoveries: nothing to chart" in quiet


@pytest.mark.django_db
def test_chart_pages_are_staff_only(operator):
    tenant = _tenant(operator, "private", InstanceStatus.RUNNING, beat_age_s=1)
    anonymous = Client().get("/dashboard/fleet/")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/dashboard/login/")
    user = Client()
    user.force_login(User.objects.create_user("not-staff", password="pw-123456789"))
    assert user.get("/dashboard/fleet/").status_code == 403
    assert user.get(f"/dashboard/tenants/{tenant.pk}/").status_code == 403
