"""Cost per span (issue 37): a model call's tokens priced from ``usage.ModelPrice`` in the trace view of the staff
dashboard and the operator portal, exact (decimal, never a float), the operator's own price over the platform's
default, another operator's price never, and an unknown model shown as "—" with a hint rather than a guess."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.test import Client

from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.services import operator_create
from tests.conversation_helpers import stub_tenant
from usage.models import ModelPrice
from usage.pricing import format_usd, price_book

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "7a2c0e51-0000-4000-8000-00000000c057"
PASSWORD = "x" * 20
PORTAL_HOST = "priced.localhost"


def _price(model: str, usd_in: str, usd_out: str, operator: object = None) -> ModelPrice:
    return ModelPrice.objects.create(operator=operator, model=model, input_usd_per_mtok=Decimal(usd_in),
                                     output_usd_per_mtok=Decimal(usd_out))


def _span(span_id: str, name: str, parent: str | None, at: str, **attributes: object) -> dict[str, object]:
    return {"trace_id": "ab" * 16, "span_id": span_id, "parent_span_id": parent, "name": name, "kind": "internal",
            "status": "ok", "started_at": f"2026-12-05T10:00:{at}+00:00", "duration_ms": 250.0,
            "attributes": attributes}


def _spans() -> list[dict[str, object]]:
    return [
        _span("01" * 8, "invoke_agent support", None, "00"),
        _span("02" * 8, "chat gpt-x", "01" * 8, "01", **{
            "gen_ai.request.model": "gpt-x", "gen_ai.response.model": "gpt-x",
            "gen_ai.usage.input_tokens": 1234, "gen_ai.usage.output_tokens": 567}),
        _span("03" * 8, "chat gpt-y", "01" * 8, "02", **{
            "gen_ai.request.model": "gpt-y", "gen_ai.usage.input_tokens": 1000, "gen_ai.usage.output_tokens": 10}),
        _span("04" * 8, "chat gpt-z", "01" * 8, "03", **{  # priced by its request model: the response's has none
            "gen_ai.request.model": "gpt-z", "gen_ai.response.model": "gpt-z-2026-01-01",
            "gen_ai.usage.input_tokens": 1, "gen_ai.usage.output_tokens": 0}),
    ]


def test_each_model_call_costs_its_operators_price_exactly_and_an_unknown_model_is_a_dash():
    ours = operator_create(slug="priced", name="Priced Resellers", actor=SYSTEM, domains=[PORTAL_HOST])
    theirs = operator_create(slug="rival", name="Rival Resellers", actor=SYSTEM)
    _price("gpt-x", "1", "2")
    _price("gpt-x", "3", "15", operator=ours)
    _price("gpt-z", "0.15", "0.6")
    # The rival's price for gpt-y must never price our customer's gpt-y call.
    _price("gpt-y", "100", "100", operator=theirs)
    tenant, stub = stub_tenant(ours)
    stub.tasks[TASK] = {"id": TASK, "kind": "demo", "status": "done", "blocked_reason": None,
                        "created_at": "2026-12-05T10:00:00Z", "updated_at": "2026-12-05T10:00:05Z"}
    stub.spans[TASK] = _spans()

    staff = Client()
    staff.force_login(User.objects.create_user("staff-costs", password=PASSWORD, is_staff=True))
    member = User.objects.create_user("member-costs", password=PASSWORD)
    OperatorMembership.objects.create(user=member, operator=ours, role="member")
    portal = Client(HTTP_HOST=PORTAL_HOST)
    portal.force_login(member)
    for resp in (staff.get(f"/dashboard/tenants/{tenant.pk}/tasks/{TASK}/"),
                 portal.get(f"/customers/{tenant.pk}/tasks/{TASK}/")):
        html = resp.content.decode()
        assert resp.status_code == 200, html[:2000]
        # 1234 in at $3/M + 567 out at $15/M = 0.003702 + 0.008505; gpt-z: 1 in at $0.15/M, by its request model.
        costs = re.findall(r'data-testid="span-cost"[^>]*>(.*?)</span>(?:</span>)?', html, re.S)
        assert costs[0] == "$0.012207", costs
        assert costs[1].startswith("— ") and "no price for gpt-y" in costs[1], costs
        assert 'title="No price for gpt-y: staff set one under Django admin, Usage, Model prices"' in html
        assert costs[2] == "$0.00000015", costs
        total = re.search(r'data-testid="trace-cost">(.*?)</p>', html, re.S).group(1)
        assert "<strong>$0.01220715</strong> for 2 model calls" in total and "without gpt-y: no price set" in total


def test_price_book_is_decimal_exact_and_per_operator_over_the_default():
    ours = operator_create(slug="book-ours", name="Ours", actor=SYSTEM)
    theirs = operator_create(slug="book-theirs", name="Theirs", actor=SYSTEM)
    _price("gpt-x", "1", "2")
    _price("gpt-x", "3", "15", operator=ours)
    _price("gpt-y", "7", "7", operator=theirs)
    cost = price_book(ours).cost(("gpt-x",), 1234, 567)
    assert isinstance(cost, Decimal) and cost == Decimal("0.012207")
    assert price_book(theirs).cost(("gpt-x",), 1234, 567) == Decimal("0.002368")  # the default: 0.001234 + 0.001134
    assert price_book(ours).cost(("gpt-y",), 1000, 0) is None  # theirs only
    assert price_book(None).cost(("gpt-y",), 1000, 0) is None
    assert price_book(theirs).cost(("gpt-y",), 1000, 0) == Decimal("0.007")
    assert format_usd(Decimal("0.007")) == "$0.007" and format_usd(Decimal("1.5")) == "$1.50"
    with pytest.raises(IntegrityError), transaction.atomic():  # one default per model
        _price("gpt-x", "9", "9")


def test_the_usage_export_prices_each_customer_day_at_its_operators_prices(make_token):
    import csv
    import io
    from datetime import date

    from django.utils import timezone
    from rest_framework.test import APIClient

    from tenants.models import Tenant
    from usage.models import UsageDay

    ours = operator_create(slug="export-ours", name="Ours", actor=SYSTEM)
    theirs = operator_create(slug="export-theirs", name="Theirs", actor=SYSTEM)
    _price("m", "0.5", "1.5")
    _price("m", "99", "99", operator=theirs)
    _price("n", "1", "1", operator=theirs)
    tenant = Tenant.objects.create(operator=ours, slug="exported", name="Exported")
    now = timezone.now()
    UsageDay.objects.create(tenant=tenant, day=date(2026, 3, 1), input_tokens=3000, output_tokens=333,
                            tokens_by_model={"m": {"input": 3000, "output": 333}}, collected_at=now)
    UsageDay.objects.create(tenant=tenant, day=date(2026, 3, 2), input_tokens=10, output_tokens=0,  # n: theirs only
                            tokens_by_model={"m": {"input": 5, "output": 0}, "n": {"input": 5, "output": 0}},
                            collected_at=now)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(ours)}")
    resp = client.get("/api/v1/usage?from=2026-03-01&to=2026-03-31&format=csv")
    assert resp.status_code == 200, resp.content
    rows = list(csv.DictReader(io.StringIO(resp.content.decode())))
    # 3000 at $0.5/M + 333 at $1.5/M = 0.0015 + 0.0004995 (the default: the rival's $99 never applies)
    assert [(r["day"], r["model_cost_usd"]) for r in rows] == [("2026-03-01", "0.0019995"), ("2026-03-02", "")]
    as_json = client.get("/api/v1/usage?from=2026-03-01&to=2026-03-31").json()["results"]
    assert [r["model_cost_usd"] for r in as_json] == ["0.0019995", None]
