"""Cross-origin calls: an operator's own web front end (on one of its domains) may call the endpoints a customer
token opens; other origins and every other endpoint get no CORS headers, and no cookies cross origins."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.fixture
def front_end(operator):  # type: ignore[no-untyped-def]
    operator.domains = ["shop.example.com"]
    operator.save(update_fields=["domains"])
    return "https://shop.example.com"


def preflight(path: str, origin: str):  # type: ignore[no-untyped-def]
    return Client().options(path, HTTP_ORIGIN=origin, HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST",
                            HTTP_ACCESS_CONTROL_REQUEST_HEADERS="authorization, content-type, idempotency-key")


def test_an_operator_domain_may_call_the_customer_endpoints(front_end: str) -> None:
    tenant = uuid.uuid4()
    for path in (f"/api/v1/tenants/{tenant}/threads/t1/messages", f"/api/v1/tenants/{tenant}/tasks",
                 f"/api/v1/tenants/{tenant}/threads/t1/messages/{uuid.uuid4()}/reply"):
        resp = preflight(path, front_end)
        assert resp.status_code == 200, path
        assert resp["Access-Control-Allow-Origin"] == front_end
        assert "idempotency-key" in resp["Access-Control-Allow-Headers"]
        assert "Access-Control-Allow-Credentials" not in resp
    # The actual request carries the header too (here refused for want of a token: the browser may read why).
    resp = Client().get(f"/api/v1/tenants/{tenant}/tasks", HTTP_ORIGIN=front_end)
    assert resp.status_code == 401 and resp["Access-Control-Allow-Origin"] == front_end


def test_other_origins_and_other_endpoints_stay_closed(front_end: str) -> None:
    tenant = uuid.uuid4()
    for origin in ("https://evil.example", "https://shop.example.com.evil.example", "null", "file://"):
        resp = preflight(f"/api/v1/tenants/{tenant}/tasks", origin)
        assert "Access-Control-Allow-Origin" not in resp, origin
    for path in ("/api/v1/tenants", f"/api/v1/tenants/{tenant}", f"/api/v1/tenants/{tenant}/credentials/x",
                 f"/api/v1/tenants/{tenant}/customer-tokens", "/internal/v1/heartbeat", "/dashboard/"):
        resp = preflight(path, front_end)
        assert "Access-Control-Allow-Origin" not in resp, path
