"""Issue 35, schedules in the operator portal: a customer's page lists its schedules with their next fire times
(UTC), paused ones with none; another operator's member cannot open the page (404)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal.models import OperatorMembership
from schedules.services import schedule_create, schedule_update
from tenants.actors import SYSTEM
from tenants.services import operator_create
from tests.test_vault_helpers import make_tenant

pytestmark = pytest.mark.django_db

HOST_A, HOST_B = "sched-a.localhost", "sched-b.localhost"
NOW = datetime(2026, 12, 5, 6, 30, tzinfo=UTC)


def _member(operator, host: str) -> Client:  # type: ignore[no-untyped-def]
    user = User.objects.create_user(f"{operator.slug}-member")
    OperatorMembership.objects.create(user=user, operator=operator, role="member")
    client = Client(HTTP_HOST=host)
    client.force_login(user)
    return client


def test_the_customer_page_lists_schedules_with_their_next_fires():
    op_a = operator_create(slug="sched-a", name="Alpha", actor=SYSTEM, domains=[HOST_A])
    op_b = operator_create(slug="sched-b", name="Beta", actor=SYSTEM, domains=[HOST_B])
    tenant = make_tenant(op_a, "acme")
    schedule_create(tenant=tenant, name="morning-reconcile", cron="0 8 * * *", timezone_name="Europe/Paris",
                    at=None, task={"kind": "reconcile", "params": {}}, message=None, actor=SYSTEM, now=NOW)
    paused = schedule_create(tenant=tenant, name="weekly-digest", cron="0 9 * * 1", timezone_name="UTC", at=None,
                             task=None, message={"thread": "digest", "content": "Your week"}, actor=SYSTEM, now=NOW)
    schedule_update(schedule=paused, changes={"paused": True}, actor=SYSTEM, now=NOW)

    page = _member(op_a, HOST_A).get(f"/customers/{tenant.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    section = html[html.index('id="h-schedules"'):]
    section = section[:section.index("</section>")]
    assert "morning-reconcile" in section and "0 8 * * * (Europe/Paris)" in section and "task reconcile" in section
    # 08:00 in Paris in December is 07:00 UTC: the next three, from the day the schedule was made.
    for day in (5, 6, 7):
        assert f'datetime="2026-12-0{day}T07:00:00+00:00"' in section
    assert "weekly-digest" in section and "message into digest" in section and "paused" in section
    assert section.count("<time ") == 3  # the paused schedule lists no next fire

    assert _member(op_b, HOST_B).get(f"/customers/{tenant.pk}/").status_code == 404
