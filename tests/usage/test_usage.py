"""Usage per customer (issue 37): counted from a real instance's own tables, collected idempotently, served to
its operator only, exported as CSV.

The end-to-end case onboards a real agent-host (a real Celery worker, the live control plane for its credential
reads), runs known work on it (three ``metered`` tasks that report model tokens and send one email each, one chat
message) and checks the collected ``UsageDay`` row number by number; collecting again (the beat job's body run
twice) leaves the same rows. The API cases use rows written directly: they are about who may read what.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, date, datetime, timedelta

import pytest
from django.utils import timezone

from instances.client import forget_tenant
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create
from tests.conftest import kill_session_instances, onboard_ready, wait_for
from tests.conversation_helpers import post_json
from usage.models import UsageDay
from usage.selectors import usage_period
from usage.services import usage_collect, usage_collect_fleet

FIELDS = ("tasks_submitted", "tasks_done", "tasks_failed", "steps_run", "compute_s", "messages_in", "messages_out",
          "effects_committed", "input_tokens", "output_tokens", "tokens_by_model", "schema_bytes")


# --- against a real instance ---------------------------------------------------------------------------------

@pytest.fixture
def fleet(live_server, sinks, worker_factory, settings):  # type: ignore[no-untyped-def]
    extra = {"AGENT_APP": "tests.runtime.agents:AGENTS", "AGENT_HEARTBEAT_INTERVAL_S": "1",
             "AGENT_SMTP_URL": sinks["smtp"]}
    settings.INSTANCE_EXTRA_ENV = dict(extra)
    worker = worker_factory(CONTROL_PLANE_INTERNAL_URL=live_server.url,
                            INSTANCE_EXTRA_ENV=",".join(f"{k}={v}" for k, v in extra.items()))
    yield worker
    kill_session_instances()


def _status(api, tenant: Tenant, task_id: str) -> str:  # type: ignore[no-untyped-def]
    resp = api.get(f"/api/v1/tenants/{tenant.pk}/tasks/{task_id}")
    return str(resp.json().get("task", {}).get("status")) if resp.status_code == 200 else ""


def _values(row: UsageDay) -> dict[str, object]:
    return {name: getattr(row, name) for name in FIELDS}


@pytest.mark.django_db(transaction=True)
def test_usage_of_a_real_instance_that_ran_known_work_and_collecting_twice_writes_the_same_rows(api, fleet):
    tenant = onboard_ready(api.operator, "metered")
    forget_tenant(str(tenant.pk))
    tasks = []
    for n in (1, 2, 3):
        created = post_json(api, f"/api/v1/tenants/{tenant.pk}/tasks", {"kind": "metered", "params": {"n": n}})
        assert created.status_code in (201, 202), created.content
        tasks.append(created.json()["inbox"]["id"])
    sent = post_json(api, f"/api/v1/tenants/{tenant.pk}/threads/web/messages", {"content": "hello agent"})
    assert sent.status_code in (201, 202), sent.content
    tasks.append(sent.json()["inbox"]["id"])
    wait_for(lambda: all(_status(api, tenant, t) == "done" for t in tasks), timeout=90, what="tasks done")

    today = timezone.now().astimezone(UTC).date()
    rows = usage_collect(tenant=tenant)
    assert [r.day for r in rows] == [today - timedelta(days=1), today]
    yesterday, row = rows
    assert yesterday.tasks_submitted == 0 and yesterday.schema_bytes is None
    # Three tasks and the message's own task; two steps each, one for the reply.
    assert (row.tasks_submitted, row.tasks_done, row.tasks_failed, row.steps_run) == (4, 4, 0, 7)
    assert (row.messages_in, row.messages_out, row.effects_committed) == (1, 1, 3)
    # m-large reported twice per task under one provider id: counted once; m-small without an id: each report.
    assert row.tokens_by_model == {"m-large": {"input": 600, "output": 60}, "m-small": {"input": 21, "output": 9}}
    assert (row.input_tokens, row.output_tokens) == (621, 69)
    assert 0.6 <= row.compute_s < 60, row.compute_s  # three `think` steps sleep 0.2 s each
    assert row.schema_bytes is not None and row.schema_bytes > 100_000
    # The local object store and volume are measured through their drivers (files on disk): nothing unmeasured.
    assert row.object_bytes is not None and row.volume_bytes is not None and row.storage_unmeasured == {}
    assert yesterday.object_bytes is None and yesterday.volume_bytes is None  # a past day is not re-measured

    before = {r.day: _values(r) for r in UsageDay.objects.filter(tenant=tenant)}
    assert usage_collect_fleet() == 1 and usage_collect_fleet() == 1  # the beat job's body, twice
    after = {r.day: _values(r) for r in UsageDay.objects.filter(tenant=tenant)}
    assert UsageDay.objects.filter(tenant=tenant).count() == 2
    schema_now = after[today].pop("schema_bytes")
    assert schema_now is not None and before[today].pop("schema_bytes") is not None
    assert after == before

    # The operator's API and the export give the same numbers.
    body = api.get(f"/api/v1/tenants/{tenant.pk}/usage").json()
    served = next(r for r in body["results"] if r["day"] == today.isoformat())
    assert (served["tasks_submitted"], served["input_tokens"], served["effects_committed"]) == (4, 621, 3)


# --- the API: who reads what, the period, the CSV ------------------------------------------------------------

@pytest.fixture
def two_operators(db, operator, make_token):  # type: ignore[no-untyped-def]
    from rest_framework.test import APIClient

    other = operator_create(slug="op-usage-b", name="B", actor=SYSTEM)
    a1 = Tenant.objects.create(operator=operator, slug="alpha", name="Alpha")
    a2 = Tenant.objects.create(operator=operator, slug="beta", name="Beta")
    b1 = Tenant.objects.create(operator=other, slug="gamma", name="Gamma")
    now = timezone.now()
    for tenant, tasks in ((a1, 3), (a2, 5), (b1, 99)):
        for day in (date(2026, 3, 1), date(2026, 3, 2)):
            UsageDay.objects.create(tenant=tenant, day=day, tasks_submitted=tasks, input_tokens=10 * tasks,
                                    tokens_by_model={"m": {"input": 10 * tasks, "output": 0}}, collected_at=now)
    clients = {}
    for name, op in (("a", operator), ("b", other)):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(op)}")
        clients[name] = client
    return clients, (a1, a2, b1)


def test_an_operator_reads_its_customers_usage_and_another_operators_customer_is_a_404(two_operators):
    clients, (a1, a2, b1) = two_operators
    period = "from=2026-03-01&to=2026-03-31"
    mine = clients["a"].get(f"/api/v1/usage?{period}").json()
    assert mine["count"] == 4 and {r["tenant_slug"] for r in mine["results"]} == {"alpha", "beta"}
    assert clients["b"].get(f"/api/v1/usage?{period}").json()["count"] == 2
    one = clients["a"].get(f"/api/v1/tenants/{a1.pk}/usage?{period}").json()
    assert [(r["day"], r["tasks_submitted"]) for r in one["results"]] == [("2026-03-01", 3), ("2026-03-02", 3)]
    crossing = clients["a"].get(f"/api/v1/tenants/{b1.pk}/usage?{period}")
    assert crossing.status_code == 404 and crossing["Content-Type"].startswith("application/problem+json")
    as_csv = clients["a"].get(f"/api/v1/tenants/{b1.pk}/usage?{period}", HTTP_ACCEPT="text/csv")
    assert as_csv.status_code == 404 and json.loads(as_csv.content)["status"] == 404
    everything = clients["a"].get(f"/api/v1/usage?{period}&format=csv").content.decode()
    assert "gamma" not in everything and str(b1.pk) not in everything and str(a2.pk) in everything


@pytest.mark.parametrize("ask", ["accept", "format"])
def test_the_csv_export_parses_and_holds_every_row_of_the_period(two_operators, ask):
    clients, _ = two_operators
    url = "/api/v1/usage?from=2026-03-02&to=2026-03-02&limit=1"
    resp = (clients["a"].get(url, HTTP_ACCEPT="text/csv") if ask == "accept"
            else clients["a"].get(url + "&format=csv"))
    assert resp.status_code == 200 and resp["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(resp.content.decode())))
    assert [(r["tenant_slug"], r["day"], int(r["tasks_submitted"]), int(r["input_tokens"])) for r in rows] == [
        ("alpha", "2026-03-02", 3, 30), ("beta", "2026-03-02", 5, 50)]  # the whole period: no page limit
    assert json.loads(rows[0]["tokens_by_model"]) == {"m": {"input": 30, "output": 0}}
    assert rows[0]["schema_bytes"] == ""  # not measured


def test_a_bad_period_is_a_400_naming_it(two_operators):
    clients, _ = two_operators
    for query, words in (("from=2026-03-05&to=2026-03-01", "to is before from"),
                         ("from=2024-01-01&to=2026-03-01", "at most 366 days"),
                         ("from=yesterday", "from"), ("since=2026-01-01", "since"),
                         ("format=xml", "format must be json or csv")):
        resp = clients["a"].get(f"/api/v1/usage?{query}")
        assert resp.status_code == 400 and words in resp.content.decode(), (query, resp.content)


def test_the_default_period_is_this_month_so_far():
    now = datetime(2026, 3, 17, 23, 59, tzinfo=UTC)
    assert usage_period(None, None, now=now) == (date(2026, 3, 1), date(2026, 3, 17))
    assert usage_period(None, date(2026, 2, 10), now=now) == (date(2026, 2, 1), date(2026, 2, 10))


@pytest.mark.django_db
def test_only_tenants_with_a_schema_are_collected_and_one_never_booted_counts_zero(operator):
    from provisioning.models import ProvisionedResource

    booted_never = Tenant.objects.create(operator=operator, slug="fresh", name="Fresh", status="ready")
    ProvisionedResource.objects.create(tenant=booted_never, kind="database", driver="postgres-schema",
                                       external_id="schema:none", status="ready")
    ProvisionedResource.objects.create(tenant=booted_never, kind="runtime", driver="local-process",
                                       external_id="pid:1", status="provisioning")  # another kind's status
    no_schema = Tenant.objects.create(operator=operator, slug="bare", name="Bare", status="pending")
    ProvisionedResource.objects.create(tenant=no_schema, kind="database", driver="postgres-schema",
                                       external_id="", status="provisioning")
    from usage.services import usage_tenants

    assert list(usage_tenants()) == [booted_never]
    assert usage_collect_fleet() == 1
    today = UsageDay.objects.get(tenant=booted_never, day=timezone.now().astimezone(UTC).date())
    assert (today.tasks_submitted, today.steps_run, today.input_tokens, today.schema_bytes) == (0, 0, 0, 0)


@pytest.mark.django_db
def test_days_missed_while_beat_was_down_are_caught_up_at_most_a_month_back(operator):
    from usage.services import usage_days_due

    tenant = Tenant.objects.create(operator=operator, slug="catch-up", name="Catch up")
    today = date(2026, 3, 10)
    Tenant.objects.filter(pk=tenant.pk).update(created_at=datetime(2026, 3, 10, 8, tzinfo=UTC))
    tenant.refresh_from_db()
    assert usage_days_due(tenant, today) == [date(2026, 3, 9), date(2026, 3, 10)]
    UsageDay.objects.create(tenant=tenant, day=date(2026, 3, 6), collected_at=timezone.now())
    assert usage_days_due(tenant, today) == [date(2026, 3, d) for d in range(6, 11)]
    UsageDay.objects.create(tenant=tenant, day=date(2025, 12, 1), collected_at=timezone.now())
    UsageDay.objects.filter(tenant=tenant, day=date(2026, 3, 6)).delete()
    assert usage_days_due(tenant, today)[0] == date(2026, 2, 7) and len(usage_days_due(tenant, today)) == 32
