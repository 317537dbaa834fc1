"""Issue 8.4: rate limits, quotas, request size limits and slow clients.

The burst runs in-process through the real middleware, DRF throttles (counters in the configured cache:
Redis when the broker is Redis, as in CI) and ``tenant_onboard``'s quota check, from 8 threads at once
with their own database connections, while operator B keeps onboarding.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connections
from rest_framework.test import APIClient

from controlplane.celery import app as celery_app
from controlplane.ports import free_port
from controlplane.problem_types import has_page
from tests.conftest import BASE_DIR, subprocess_env, wait_for
from tests.vault.test_vault_helpers import bearer_client, make_instance, make_tenant

PROBLEM = "application/problem+json"
BURST = 1000
QUOTA_A = 5
ONBOARDING_RATE = 30


def _client(token: str) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _onboard(client: APIClient, slug: str):  # type: ignore[no-untyped-def]
    return client.post("/api/v1/tenants", data=json.dumps({"slug": slug, "name": slug, "allow_no_release": True}),
                       content_type="application/json")


def _assert_429_problem(resp) -> None:  # type: ignore[no-untyped-def]
    assert resp.status_code == 429
    assert resp["Content-Type"].startswith(PROBLEM)
    body = resp.json()
    assert body["status"] == 429 and has_page(body["type"]) and body["detail"]
    assert int(resp["Retry-After"]) >= 1


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_1000_onboardings_neither_starves_b_nor_beats_the_quota(operator, make_token, settings):
    from tenants.actors import SYSTEM
    from tenants.models import Tenant
    from tenants.services import operator_create

    if str(settings.CELERY_BROKER_URL).startswith("redis"):
        assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "onboarding": f"{ONBOARDING_RATE}/min"}}
    operator.tenant_quota = QUOTA_A
    operator.save(update_fields=["tenant_quota"])
    other = operator_create(slug=f"burst-b-{operator.slug[-6:]}", name="B", actor=SYSTEM)
    token_a, token_b = make_token(operator), make_token(other)
    results_a: list[tuple[int, str, str, str]] = []
    results_b: list[int] = []
    lock = threading.Lock()
    burst_running = threading.Event()

    def fire(indexes: range) -> None:
        client = _client(token_a)
        try:
            for i in indexes:
                resp = _onboard(client, f"a-{i}")
                row = (resp.status_code, resp.get("Content-Type", ""), resp.get("Retry-After", ""),
                       resp.json().get("type", "") if resp.status_code >= 400 else "")
                with lock:
                    results_a.append(row)
        finally:
            connections.close_all()

    def operator_b() -> None:
        client = _client(token_b)
        try:
            burst_running.wait(10)
            for i in range(10):  # while A's burst runs ...
                results_b.append(_onboard(client, f"b-during-{i}").status_code)
                time.sleep(0.05)
        finally:
            connections.close_all()

    try:
        started = time.monotonic()
        b_thread = threading.Thread(target=operator_b)
        b_thread.start()
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(fire, range(k, BURST, 8)) for k in range(8)]
            burst_running.set()
            for f in futures:
                f.result()
        b_thread.join(60)
        elapsed = time.monotonic() - started
        client_b = _client(token_b)  # ... and after it
        results_b += [_onboard(client_b, f"b-after-{i}").status_code for i in range(5)]

        assert len(results_a) == BURST
        codes = [r[0] for r in results_a]
        assert codes.count(202) == QUOTA_A, sorted(set(codes))
        assert set(codes) == {202, 429}
        for status, content_type, retry_after, problem_type in results_a:
            if status == 429:
                assert content_type.startswith(PROBLEM) and int(retry_after) >= 1
                assert problem_type.endswith(("/throttled", "/quota-exceeded"))
        throttled = sum(1 for r in results_a if r[3].endswith("/throttled"))
        # Fixed one-minute windows: at most two windows' worth got past the throttle during the burst.
        windows = 2 if elapsed < 60 else 3
        assert throttled >= BURST - windows * ONBOARDING_RATE
        assert Tenant.objects.filter(operator=operator).count() == QUOTA_A
        assert results_b == [202] * 15, results_b
        assert Tenant.objects.filter(operator=other).count() == 15
    finally:
        with celery_app.connection_for_write() as conn:  # nobody consumes these onboarding tasks
            conn.default_channel.queue_purge(settings.CELERY_TASK_DEFAULT_QUEUE)


@pytest.mark.django_db
def test_credential_throttle_is_per_operator_and_a_problem_with_retry_after(operator, make_token, settings):
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "credentials": "5/min"}}
    other = operator_create(slug=f"thr-b-{operator.slug[-6:]}", name="B", actor=SYSTEM)
    tenant_a, tenant_b = make_tenant(operator), make_tenant(other)
    client_a, client_b = _client(make_token(operator)), _client(make_token(other))
    put = json.dumps({"value": "v"})
    codes = [client_a.put(f"/api/v1/tenants/{tenant_a.pk}/credentials/k{i}", data=put,
                          content_type="application/json").status_code for i in range(5)]
    assert codes == [201] * 5
    _assert_429_problem(client_a.get(f"/api/v1/tenants/{tenant_a.pk}/credentials"))
    assert client_b.put(f"/api/v1/tenants/{tenant_b.pk}/credentials/k", data=put,
                        content_type="application/json").status_code == 201
    assert client_a.get("/api/v1/tenants").status_code == 200  # other endpoints: their own (wider) budget


@pytest.mark.django_db
def test_instance_credential_delivery_is_throttled_per_instance(operator, settings):
    from tenants.actors import SYSTEM
    from vault.services import credential_put

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "instance-credentials": "3/min"}}
    tenant_a, tenant_b = make_tenant(operator), make_tenant(operator)
    for tenant in (tenant_a, tenant_b):
        credential_put(tenant=tenant, name="k", value="v", actor=SYSTEM)
    inst_a, inst_b = bearer_client(make_instance(tenant_a)), bearer_client(make_instance(tenant_b))
    assert [inst_a.get("/internal/v1/credentials/k").status_code for _ in range(3)] == [200] * 3
    _assert_429_problem(inst_a.get("/internal/v1/credentials/k"))
    assert inst_b.get("/internal/v1/credentials/k").status_code == 200
    assert inst_a.post("/internal/v1/heartbeat", data="{}", content_type="application/json").status_code == 204


@pytest.mark.django_db
def test_quota_429_is_a_problem_with_retry_after(api):
    api.operator.tenant_quota = 0
    api.operator.save(update_fields=["tenant_quota"])
    resp = _onboard(api, "over")
    _assert_429_problem(resp)
    assert resp.json()["type"].endswith("/quota-exceeded")


@pytest.mark.django_db
@pytest.mark.parametrize("what", ["oversized", "deeply nested", "nul in path", "nul in query", "nul in header",
                                  "huge limit"])
def test_hostile_bodies_and_parameters_are_4xx_never_500(api, what):
    from django.test import Client

    tenant = make_tenant(api.operator)
    instance = bearer_client(make_instance(tenant), raise_request_exception=False)
    api.raise_request_exception = False
    big = json.dumps({"value": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)})
    deep = "[" * 50_000
    cases = {
        "oversized": [api.put(f"/api/v1/tenants/{tenant.pk}/credentials/k", data=big, content_type="application/json"),
                      instance.post("/internal/v1/heartbeat", data=big, content_type="application/json")],
        "deeply nested": [api.post("/api/v1/tenants", data=deep, content_type="application/json"),
                          api.put(f"/api/v1/tenants/{tenant.pk}/credentials/k", data=deep,
                                  content_type="application/json"),
                          instance.post("/internal/v1/heartbeat", data=deep, content_type="application/json")],
        "nul in path": [api.get(f"/api/v1/tenants/{tenant.pk}/credentials/a%00b"),
                        instance.get("/internal/v1/credentials/a%00b"),
                        Client(raise_request_exception=False).get("/branding/assets/a%00b")],
        "nul in query": [api.get("/api/v1/tenants?status=%00"),
                         Client(raise_request_exception=False).get("/dashboard/tenants/?q=a%00")],
        "nul in header": [api.post("/api/v1/tenants", data=json.dumps({"slug": "x", "name": "x"}),
                                   content_type="application/json", HTTP_IDEMPOTENCY_KEY="a\x00b")],
        "huge limit": [api.get("/api/v1/tenants?limit=99999999999999999999"),
                       api.get(f"/api/v1/tenants/{tenant.pk}/recoveries?limit=99999999999999999999"
                               "&offset=99999999999999999999")],
    }
    for resp in cases[what]:
        expected = {"oversized": 413}.get(what, 400)
        assert resp.status_code == expected, (what, resp.status_code, resp.content[:300])


@pytest.mark.django_db
def test_too_many_form_fields_are_refused(client):
    data = "&".join(f"f{i}=1" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 10))
    client.raise_request_exception = False
    resp = client.post("/dashboard/login/", data=data, content_type="application/x-www-form-urlencoded")
    assert resp.status_code == 400


@pytest.mark.django_db  # the server's settings point at the test database, like every subprocess here
def test_gunicorn_cuts_off_a_slow_client_and_keeps_serving(tmp_path):
    """The production server config (deploy/gunicorn.conf.py) with a 2 s timeout: a client trickling its
    request headers loses its connection, and the server answers the next client."""
    port = free_port()
    env = subprocess_env(GUNICORN_BIND=f"127.0.0.1:{port}", GUNICORN_WORKERS="1", GUNICORN_TIMEOUT="2",
                         GUNICORN_GRACEFUL_TIMEOUT="1", GUNICORN_WORKER_TMP_DIR=str(tmp_path))
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "--config", str(BASE_DIR / "deploy/gunicorn.conf.py"),
                               "controlplane.wsgi:application"], cwd=BASE_DIR, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def healthy() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    return b"200 OK" in s.recv(4096)
            except OSError:
                return False

        wait_for(healthy, timeout=30, what="gunicorn up")
        slow = socket.create_connection(("127.0.0.1", port), timeout=15)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # ... and never finishes the headers
        started = time.monotonic()
        try:
            data = slow.recv(4096)  # closed by the server (b"") or reset
        except ConnectionResetError:
            data = b""
        cut_after = time.monotonic() - started
        slow.close()
        # Cut off: closed, or an error written by gunicorn itself while aborting the stuck worker.
        assert data == b"" or data.startswith((b"HTTP/1.1 4", b"HTTP/1.1 5")), data[:100]
        assert 1.5 < cut_after < 10, cut_after
        wait_for(healthy, timeout=15, what="a fresh worker answering")
    finally:
        server.terminate()
        server.wait(15)
