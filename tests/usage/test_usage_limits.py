"""The plan's monthly limits and storage metering (issue 37).

Limits: a plan with ``max_tasks_per_month`` / ``max_tokens_per_month`` refuses a NEW task or message with 429
``monthly-limit-reached`` (the limit's name, the month's usage, when it resets, ``Retry-After``), through the
inbox's real insert statement against real PostgreSQL; a retry of an accepted key is still answered; a cancel
is never limited; the limits endpoint and the portal show the same usage the refusal names.

Storage: the object-store and volume drivers measure what a tenant holds: the local store and volume on disk, the
S3 store through a listing of moto's real S3 server over HTTP. A driver that cannot measure (a Kubernetes PVC)
leaves the figure null with its reason in the collected row.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import pytest
from django.utils import timezone

from conversations.models import InboxItem
from conversations.monthly_limits import month_window
from provisioning.drivers.base import TenantId, TenantSpec
from provisioning.drivers.local_objectstore import LocalObjectStoreDriver
from provisioning.drivers.local_volume import LocalVolumeDriver
from provisioning.drivers.s3_objectstore import S3ObjectStoreDriver
from tenants.models import Plan, Tenant
from tests.tenants.test_api_tenants import assert_problem, post
from usage.models import UsageDay
from usage.services import usage_storage_measure


def _send(api, tenant_id: str, key: str, *, kind: str = "message"):  # type: ignore[no-untyped-def]
    if kind == "message":
        url, body = f"/api/v1/tenants/{tenant_id}/threads/main/messages", {"content": f"hello {key}"}
    else:
        url, body = f"/api/v1/tenants/{tenant_id}/tasks", {"kind": "noop", "params": {"k": key}}
    return api.post(url, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def test_the_monthly_task_limit_refuses_new_work_with_a_429_naming_it(api):
    Plan.objects.create(slug="monthly", name="Monthly", max_tasks_per_month=3)
    tenant = post(api, {"slug": "month-co", "name": "Month", "plan": "monthly"}).json()
    tid = tenant["id"]
    # Last month's items do not count: the month is the UTC calendar month.
    assert _send(api, tid, "old").status_code == 202
    InboxItem.objects.filter(tenant_id=tid).update(created_at=month_window()[0] - timedelta(seconds=1))
    # Messages and tasks both count against it (a message is a task of the agent's too).
    assert _send(api, tid, "a").status_code == 202 and _send(api, tid, "b", kind="task").status_code == 202
    assert _send(api, tid, "c").status_code == 202
    refused = _send(api, tid, "d", kind="task")
    problem = assert_problem(refused, 429)
    assert problem["type"].endswith("/monthly-limit-reached") and problem["title"] == "Monthly limit reached"
    assert (problem["limit"], problem["limit_value"], problem["used"], problem["plan"]) == (
        "max_tasks_per_month", 3, 3, "monthly")
    _, resets = month_window()
    assert problem["resets_at"] == resets.isoformat() and resets.isoformat() in problem["detail"]
    assert "max_tasks_per_month" in problem["detail"] and "used 3" in problem["detail"]
    wait = int(refused["Retry-After"])
    assert 0 < wait <= int((resets - timezone.now()).total_seconds()) + 1
    assert not InboxItem.objects.filter(tenant_id=tid, idempotency_key="d").exists()  # the insert was undone
    assert _send(api, tid, "a").status_code == 202  # a retry of an accepted message is answered, not refused

    limits = api.get(f"/api/v1/tenants/{tid}/usage/limits").json()
    by_name = {lim["limit"]: lim for lim in limits["limits"]}
    assert by_name["max_tasks_per_month"] == {"limit": "max_tasks_per_month", "limit_value": 3, "used": 3,
                                              "reached": True, "resets_at": by_name["max_tasks_per_month"]
                                              ["resets_at"]}
    assert by_name["max_tokens_per_month"]["limit_value"] is None and not by_name["max_tokens_per_month"]["reached"]


def test_the_monthly_token_limit_reads_the_collected_usage_and_a_larger_plan_lifts_it(api):
    Plan.objects.create(slug="tokens", name="Tokens", max_tokens_per_month=1000)
    Plan.objects.create(slug="bigger", name="Bigger", max_tokens_per_month=5000)
    tid = post(api, {"slug": "token-co", "name": "Tokens", "plan": "tokens"}).json()["id"]
    tenant = Tenant.objects.get(pk=tid)
    today = timezone.now().astimezone(UTC).date()
    start = month_window()[0].date()
    now = timezone.now()
    UsageDay.objects.create(tenant=tenant, day=start - timedelta(days=1), input_tokens=10_000, collected_at=now)
    assert _send(api, tid, "a").status_code == 202  # last month's 10,000 tokens do not count
    UsageDay.objects.create(tenant=tenant, day=today, input_tokens=700, output_tokens=299, collected_at=now)
    assert _send(api, tid, "b", kind="task").status_code == 202  # 999 < 1000
    UsageDay.objects.filter(tenant=tenant, day=today).update(output_tokens=300)
    problem = assert_problem(_send(api, tid, "c"), 429)
    assert (problem["limit"], problem["limit_value"], problem["used"]) == ("max_tokens_per_month", 1000, 1000)
    assert "max_tokens_per_month" in problem["detail"] and "model tokens" in problem["detail"]
    # A cancel is never limited (running work is not stopped by the limit).
    task_id = InboxItem.objects.get(tenant_id=tid, idempotency_key="b").id
    cancel = api.post(f"/api/v1/tenants/{tid}/tasks/{task_id}/cancel", data="{}", content_type="application/json")
    assert cancel.status_code != 429, cancel.content
    Tenant.objects.filter(pk=tid).update(plan="bigger")
    assert _send(api, tid, "c").status_code == 202


@pytest.mark.django_db
def test_the_portal_shows_the_limit_and_the_month_s_usage(operator):
    from portal.selectors import customer_usage

    plan = Plan.objects.create(slug="capped", name="Capped", max_tasks_per_month=2, max_tokens_per_month=50)
    tenant = Tenant.objects.create(operator=operator, slug="capped-co", name="Capped", plan=plan)
    UsageDay.objects.create(tenant=tenant, day=timezone.now().astimezone(UTC).date(), input_tokens=40,
                            output_tokens=20, collected_at=timezone.now())
    limits = {lim.field: (lim.limit, lim.used, lim.reached) for lim in customer_usage(tenant).limits}
    assert limits == {"max_tasks_per_month": (2, 0, False), "max_tokens_per_month": (50, 60, True)}
    Tenant.objects.filter(pk=tenant.pk).update(plan=Plan.objects.create(slug="free-for-all", name="Unlimited"))
    assert customer_usage(Tenant.objects.get(pk=tenant.pk)).limits == []  # unlimited: nothing to show


def test_the_month_window_resets_at_the_next_utc_month():
    assert month_window(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == (
        datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    assert month_window(datetime(2026, 3, 1, 0, 0, tzinfo=UTC))[1] == datetime(2026, 4, 1, tzinfo=UTC)


# --- storage -------------------------------------------------------------------------------------------------

SPEC = TenantSpec(tenant_id=TenantId("11111111-1111-1111-1111-111111111111"), resource_name="t_usage_store",
                  operator_slug="acme")


def test_the_local_store_and_volume_measure_their_files(settings, tmp_path):
    settings.LOCAL_OBJECTSTORE_ROOT = str(tmp_path / "objects")
    settings.LOCAL_VOLUME_ROOT = str(tmp_path / "volumes")
    store, volume = LocalObjectStoreDriver(), LocalVolumeDriver()
    assert store.bytes_used(SPEC) == 0 and volume.bytes_used(SPEC) == 0  # nothing made yet
    prefix = tmp_path / "objects" / "tenants" / SPEC.tenant_id
    (prefix / "blobs").mkdir(parents=True)
    (prefix / "blobs" / "a").write_bytes(b"x" * 1000)
    (prefix / "b").write_bytes(b"y" * 234)
    (prefix / "link").symlink_to(prefix / "blobs" / "a")  # not followed: counted once
    other = tmp_path / "objects" / "tenants" / "someone-else"
    other.mkdir()
    (other / "c").write_bytes(b"z" * 99)
    assert store.bytes_used(SPEC) == 1234
    work = tmp_path / "volumes" / SPEC.resource_name / "workspace"
    work.mkdir(parents=True)
    (work / "notes.txt").write_bytes(b"n" * 4096)
    assert volume.bytes_used(SPEC) == 4096


def test_the_s3_store_measures_the_tenant_prefix_through_its_listing(settings):
    import boto3

    from tests.k8s_fixtures import moto_server

    with moto_server() as url:
        settings.S3_ENDPOINT_URL, settings.S3_BUCKET, settings.S3_REGION = url, "usage-bytes", "us-east-1"
        settings.S3_CREATE_BUCKET, settings.S3_ROLE_ARN = True, ""
        settings.S3_ACCESS_KEY_ID, settings.S3_SECRET_ACCESS_KEY = "cp-test", "cp-test-secret"
        driver = S3ObjectStoreDriver()
        driver.ensure(SPEC)
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="cp-test",
                          aws_secret_access_key="cp-test-secret")
        for n in range(1005):  # more than one listing page (1,000 keys)
            s3.put_object(Bucket="usage-bytes", Key=f"tenants/{SPEC.tenant_id}/o/{n}", Body=b"q" * 10)
        s3.put_object(Bucket="usage-bytes", Key="tenants/another/o", Body=b"r" * 777)
        s3.put_object(Bucket="usage-bytes", Key=f"archives/{SPEC.tenant_id}/a.tar", Body=b"s" * 555)
        assert driver.bytes_used(SPEC) == 10_050  # the marker is empty; the archive is outside the prefix


@pytest.mark.django_db
def test_a_driver_that_cannot_measure_leaves_null_with_its_reason(operator, settings, tmp_path):
    settings.LOCAL_OBJECTSTORE_ROOT = str(tmp_path / "objects")
    settings.PROVISIONING_PROFILE = "kubernetes"  # k8s-pvc: a PVC's usage is not in the Kubernetes API
    settings.S3_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens: the store's failure is a reason too
    settings.S3_BUCKET, settings.S3_ACCESS_KEY_ID, settings.S3_SECRET_ACCESS_KEY = "nowhere", "k", "s"
    tenant = Tenant.objects.create(operator=operator, slug="k8s-co", name="K8s")
    measured, why = usage_storage_measure(tenant)
    assert measured == {"object_bytes": None, "volume_bytes": None}
    assert why["volume_bytes"] == "the k8s-pvc driver cannot measure its bytes"
    assert why["object_bytes"].startswith("the s3-prefix driver failed: ")


def test_storage_columns_are_in_the_csv(api):
    tenant = Tenant.objects.create(operator=api.operator, slug="csv-co", name="CSV")
    UsageDay.objects.create(tenant=tenant, day=date(2026, 3, 2), object_bytes=12, volume_bytes=None,
                            storage_unmeasured={"volume_bytes": "the k8s-pvc driver cannot measure its bytes"},
                            collected_at=timezone.now())
    text = api.get(f"/api/v1/tenants/{tenant.pk}/usage?from=2026-03-01&to=2026-03-31&format=csv").content.decode()
    header, line = text.splitlines()[:2]
    assert "object_bytes,volume_bytes,storage_unmeasured" in header
    assert ',12,,"{""volume_bytes"":""the k8s-pvc driver cannot measure its bytes""}",' in line


# --- the staff dashboard -------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_dashboard_usage_screens_show_the_fleet_and_one_customer(operator):
    from django.contrib.auth.models import User
    from django.test import Client

    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    other = operator_create(slug="op-usage-dash", name="Other", actor=SYSTEM)
    a = Tenant.objects.create(operator=operator, slug="dash-a", name="Dash A",
                              plan=Plan.objects.create(slug="dash-plan", name="D", max_tokens_per_month=100))
    b = Tenant.objects.create(operator=other, slug="dash-b", name="Dash B")
    now = timezone.now()
    for tenant, day, tokens in ((a, date(2026, 3, 1), 30), (a, date(2026, 3, 2), 50), (b, date(2026, 3, 2), 7)):
        UsageDay.objects.create(tenant=tenant, day=day, input_tokens=tokens, output_tokens=1, tasks_submitted=2,
                                tokens_by_model={"m-large": {"input": tokens, "output": 1}}, volume_bytes=None,
                                storage_unmeasured={"volume_bytes": "the k8s-pvc driver cannot measure its bytes"},
                                object_bytes=2048, collected_at=now)
    staff, plain = Client(), Client()
    staff.force_login(User.objects.create_user("usage-staff", password="x-pass-1234", is_staff=True))
    plain.force_login(User.objects.create_user("usage-plain", password="x-pass-1234"))
    period = "?from=2026-03-01&to=2026-03-31"
    assert plain.get(f"/dashboard/usage/{period}").status_code in (302, 403)
    page = staff.get(f"/dashboard/usage/{period}").content.decode()
    assert 'data-testid="usage-fleet-tokens">87 in, 3 out' in page  # every operator's customers
    assert "dash-a" in page and "dash-b" in page and "<svg" in page and "Model tokens per day" in page
    one = staff.get(f"/dashboard/tenants/{a.pk}/usage/{period}").content.decode()
    assert "<code>m-large</code> 50/1" in one and "dash-b" not in one
    assert "volume_bytes: the k8s-pvc driver cannot measure its bytes" in one
    assert 'data-testid="usage-limit-max_tokens_per_month">0 of 100' in one  # this month (not March 2026)
    bad = staff.get("/dashboard/usage/?from=yesterday").content.decode()
    assert 'data-testid="usage-period-note"' in bad
    detail = staff.get(f"/dashboard/tenants/{a.pk}/").content.decode()
    assert f'href="/dashboard/tenants/{a.pk}/usage/"' in detail
