"""Operators set their own model prices in the portal (``portal/price_views.py``, ``usage/price_services.py``):
the list beside the platform defaults (read-only), the form's messages next to their fields, audit rows, and the
boundary: another operator's price, or a default, is a 404 for every method, even by id."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tenants.services import operator_create
from usage.models import ModelPrice
from usage.pricing import price_book

pytestmark = pytest.mark.django_db

HOST_A, HOST_B = "prices-a.localhost", "prices-b.localhost"
MODEL = "gpt-4o-mini-2024-07-18"


@pytest.fixture
def world():  # type: ignore[no-untyped-def]
    op_a = operator_create(slug="prices-a", name="Alpha", actor=SYSTEM, domains=[HOST_A])
    op_b = operator_create(slug="prices-b", name="Beta", actor=SYSTEM, domains=[HOST_B])
    clients = {}
    for name, operator, host, role in (("a", op_a, HOST_A, "admin"), ("b", op_b, HOST_B, "admin"),
                                       ("a-viewer", op_a, HOST_A, "viewer"), ("a-member", op_a, HOST_A, "member")):
        user = User.objects.create_user(f"prices-{name}")
        OperatorMembership.objects.create(user=user, operator=operator, role=role)
        client = Client(HTTP_HOST=host)
        client.force_login(user)
        clients[name] = client
    ModelPrice.objects.create(operator=None, model=MODEL, input_usd_per_mtok=Decimal("0.15"),
                              output_usd_per_mtok=Decimal("0.6"))
    ModelPrice.objects.create(operator=None, model="claude-x", input_usd_per_mtok=Decimal(3),
                              output_usd_per_mtok=Decimal(15))
    return {"a": op_a, "b": op_b, **{f"client_{k}": v for k, v in clients.items()}}


def test_an_admin_sets_a_price_that_wins_over_the_default_audited(world):
    client, op_a = world["client_a"], world["a"]
    page = client.get("/prices/").content.decode()
    assert 'href="/prices/"' in page and 'data-testid="price-form"' in page  # nav link, and the form for admins
    assert "$0.15" in page and "$15.00" in page and "read-only" in page  # the defaults, shown beside
    created = client.post("/prices/", {"model": MODEL, "input_usd_per_mtok": "0.2",
                                       "output_usd_per_mtok": "0.8"})
    assert created.status_code == 302 and created["Location"] == "/prices/"
    own = ModelPrice.objects.get(operator=op_a, model=MODEL)
    assert own.input_usd_per_mtok == Decimal("0.2") and own.output_usd_per_mtok == Decimal("0.8")
    assert price_book(op_a).price(MODEL).source == "operator"  # the trace's cost uses it
    assert price_book(world["b"]).price(MODEL).input_usd_per_mtok == Decimal("0.15")  # B keeps the default
    row = AuditLog.objects.get(action="model_price.create")
    assert row.operator_id == op_a.pk and row.actor_label == "prices-a via prices-a portal"
    assert row.data == {"model": MODEL, "input_usd_per_mtok": "0.2", "output_usd_per_mtok": "0.8"}
    listed = client.get("/prices/").content.decode()
    assert "your price applies" in listed and "$0.20" in listed

    changed = client.post(f"/prices/{own.pk}/", {"input_usd_per_mtok": "0.25", "output_usd_per_mtok": "1"})
    assert changed.status_code == 302
    own.refresh_from_db()
    assert own.input_usd_per_mtok == Decimal("0.25") and own.output_usd_per_mtok == Decimal(1)
    update = AuditLog.objects.get(action="model_price.update")
    assert update.data["before"]["input_usd_per_mtok"] == "0.200000"

    confirm = client.get(f"/prices/{own.pk}/delete/")
    assert confirm.status_code == 200 and "platform&#x27;s default price" in confirm.content.decode()
    assert ModelPrice.objects.filter(pk=own.pk).exists()  # the GET only asks
    assert client.post(f"/prices/{own.pk}/delete/").status_code == 302
    assert not ModelPrice.objects.filter(pk=own.pk).exists()
    assert AuditLog.objects.filter(action="model_price.delete", operator=op_a).count() == 1
    assert price_book(op_a).price(MODEL).source == "default"
    assert ModelPrice.objects.filter(operator=None).count() == 2  # the defaults untouched


@pytest.mark.parametrize(("data", "field", "message"), [
    ({"model": "", "input_usd_per_mtok": "1", "output_usd_per_mtok": "1"}, "model", "This field is required."),
    ({"model": "gpt 4o", "input_usd_per_mtok": "1", "output_usd_per_mtok": "1"}, "model", "no spaces"),
    ({"model": "m", "input_usd_per_mtok": "-1", "output_usd_per_mtok": "1"}, "input_usd_per_mtok",
     "greater than or equal to 0"),
    ({"model": "m", "input_usd_per_mtok": "1", "output_usd_per_mtok": "abc"}, "output_usd_per_mtok",
     "Enter a number."),
    ({"model": "m", "input_usd_per_mtok": "0.1234567", "output_usd_per_mtok": "1"}, "input_usd_per_mtok",
     "no more than 6 decimal places"),
    ({"model": "m", "input_usd_per_mtok": "1" * 13, "output_usd_per_mtok": "1"}, "input_usd_per_mtok",
     "no more than 12 digits"),
])
def test_a_refused_price_shows_its_message_next_to_its_field(world, data, field, message):
    refused = world["client_a"].post("/prices/", data)
    page = refused.content.decode()
    assert refused.status_code == 400
    error = page.split(f'id="id_{field}_error"', 1)
    assert len(error) == 2 and message in error[1].split("</ul>", 1)[0]
    assert f'value="{data["model"]}"' in page or not data["model"]  # the edits are kept
    assert not ModelPrice.objects.filter(operator=world["a"]).exists()
    assert not AuditLog.objects.filter(action__startswith="model_price.").exists()


def test_a_second_price_for_the_same_model_is_refused_inline(world):
    client = world["client_a"]
    data = {"model": MODEL, "input_usd_per_mtok": "1", "output_usd_per_mtok": "2"}
    assert client.post("/prices/", data).status_code == 302
    again = client.post("/prices/", {**data, "input_usd_per_mtok": "9"})
    assert again.status_code == 400 and "already have a price for this model" in again.content.decode()
    assert ModelPrice.objects.get(operator=world["a"], model=MODEL).input_usd_per_mtok == Decimal(1)
    assert AuditLog.objects.filter(action="model_price.create").count() == 1


def test_an_operator_never_sees_or_touches_another_operators_price(world):
    price_b = ModelPrice.objects.create(operator=world["b"], model="secret-model-b",
                                        input_usd_per_mtok=Decimal(7), output_usd_per_mtok=Decimal(8))
    default = ModelPrice.objects.get(operator=None, model=MODEL)
    client_a = world["client_a"]
    assert "secret-model-b" not in client_a.get("/prices/").content.decode()
    for price in (price_b, default):  # B's row, and a staff default: neither is A's to change
        assert client_a.get(f"/prices/{price.pk}/").status_code == 404
        assert client_a.post(f"/prices/{price.pk}/", {"input_usd_per_mtok": "0",
                                                      "output_usd_per_mtok": "0"}).status_code == 404
        assert client_a.get(f"/prices/{price.pk}/delete/").status_code == 404
        assert client_a.post(f"/prices/{price.pk}/delete/").status_code == 404
    price_b.refresh_from_db()
    assert price_b.input_usd_per_mtok == Decimal(7)
    assert ModelPrice.objects.filter(operator=None).count() == 2
    assert not AuditLog.objects.filter(action__startswith="model_price.").exists()
    # B sees and edits its own row.
    assert "secret-model-b" in world["client_b"].get("/prices/").content.decode()
    assert world["client_b"].get(f"/prices/{price_b.pk}/").status_code == 200


def test_members_and_viewers_read_the_prices_and_only_admins_write(world):
    own = ModelPrice.objects.create(operator=world["a"], model="mine", input_usd_per_mtok=Decimal(1),
                                    output_usd_per_mtok=Decimal(2))
    for who in ("a-viewer", "a-member"):
        client = world[f"client_{who}"]
        page = client.get("/prices/")
        assert page.status_code == 200 and "mine" in page.content.decode()
        assert 'data-testid="price-form"' not in page.content.decode()
        assert client.post("/prices/", {"model": "x", "input_usd_per_mtok": "1",
                                        "output_usd_per_mtok": "1"}).status_code == 403
        assert client.post(f"/prices/{own.pk}/", {"input_usd_per_mtok": "0",
                                                  "output_usd_per_mtok": "0"}).status_code == 403
        assert client.post(f"/prices/{own.pk}/delete/").status_code == 403
    assert ModelPrice.objects.filter(operator=world["a"]).count() == 1


def test_the_forms_need_their_csrf_token(world):
    user = User.objects.get(username="prices-a")
    strict = Client(HTTP_HOST=HOST_A, enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post("/prices/", {"model": "x", "input_usd_per_mtok": "1",
                                    "output_usd_per_mtok": "1"}).status_code == 403
    assert not ModelPrice.objects.filter(operator=world["a"]).exists()
