"""What one message costs the control plane in SQL (issue 39): the statements a proxied message runs, counted,
so a regression fails here. docs/conversations.md ("What a message costs") lists them."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
import redis
from django.core.cache import cache
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from conversations.choices import InboxStatus
from conversations.models import InboxItem
from provisioning.models import AgentInstance
from tests.conversation_helpers import post_json, stub_tenant

# Committed transactions, as production runs them (a test transaction would turn them into savepoints).
pytestmark = pytest.mark.django_db(transaction=True)


def _send(api, tenant, n: int):  # type: ignore[no-untyped-def]
    resp = post_json(api, f"/api/v1/tenants/{tenant.pk}/threads/t-{n}/messages", {"content": "hello"},
                     **{"Idempotency-Key": f"cost-{n}"})
    assert resp.status_code == 201, resp.content
    assert resp.json()["inbox"]["status"] == "delivered"


def test_a_delivered_message_costs_a_fixed_number_of_statements(api, operator):
    tenant, stub = stub_tenant(operator)
    try:
        _send(api, tenant, 0)  # warm: the instance's key and address, the token's cache entry
        with CaptureQueriesContext(connection) as sent:
            _send(api, tenant, 1)
    finally:
        stub.stop()
    statements = [q["sql"] for q in sent.captured_queries]
    # BEGIN, the item with its audit row, the thread's policy, its plan's limit, the older-pending check, the
    # instance's activity and the cached operator token's confirmation (one statement), COMMIT; the instance
    # called; the settle. (The health check sends nothing: controlplane/db; it was a 15th round trip.) 14 before
    # issue 39, 7 while the thread's policy was a read of its own, 6 while the activity was, 5 while the token was
    # looked up by every request (tests/conversations/test_cached_credentials.py).
    assert len(statements) == 4, "\n".join(statements)
    assert not any(s.lstrip().upper().startswith("SELECT POLICY") for s in statements), "the policy is in the insert"
    assert sum(s in ("BEGIN", "COMMIT") for s in statements) == 2, "one transaction before the call"
    insert = next(i for i, s in enumerate(statements) if "INSERT INTO" in s and "conversations_inboxitem" in s)
    assert "UPDATE provisioning_agentinstance" in statements[insert], "the activity is in the insert's statement"
    assert insert < statements.index("COMMIT"), "the instance's activity commits with the item"


def test_a_message_costs_the_throttle_one_redis_round_trip(api, operator):
    """The throttle's counter is INCRBY (redis-py's incr) and EXPIRE pipelined: Redis itself (MONITOR) sees those
    two and no other for the counter. Through DRF's cache proxy the pipelined path was never taken (SET NX, EXISTS,
    INCRBY: three round trips) and no test noticed, because the counts above are SQL only."""
    backend = cache._connections[cache._alias]  # type: ignore[attr-defined]
    if not isinstance(backend, RedisCache):
        pytest.skip("the cache is not Redis here")
    tenant, stub = stub_tenant(operator)
    seen: list[str] = []
    sentinel = f"hop-sentinel-{tenant.pk}"
    monitor_client = redis.Redis.from_url(backend._servers[0])  # type: ignore[attr-defined]
    try:
        _send(api, tenant, 0)
        with monitor_client.monitor() as monitor:
            _send(api, tenant, 1)
            monitor_client.connection_pool.get_connection().send_command("ECHO", sentinel)  # our end marker
            for event in monitor.listen():
                command = event["command"]
                if sentinel in command:
                    break
                if "throttle:" in command:
                    seen.append(command.split()[0].upper())
    finally:
        stub.stop()
        monitor_client.close()
    assert seen == ["INCRBY", "EXPIRE"], seen


def test_the_connection_health_check_sends_nothing_and_still_finds_a_closed_connection():
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'hop-health-marker'")
    pid = connection.connection.info.backend_pid
    dsn = connection.connection.info.dsn

    def last_query() -> str:
        with psycopg.connect(dsn, password=connection.settings_dict.get("PASSWORD") or None,
                             autocommit=True) as other:
            return other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]

    assert connection.is_usable()
    assert "hop-health-marker" in last_query()  # no SELECT 1 was sent
    with psycopg.connect(dsn, password=connection.settings_dict.get("PASSWORD") or None, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while connection.is_usable() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not connection.is_usable()
    connection.close()


def test_a_message_while_the_instance_row_is_locked_commits_then_records_its_activity(api, operator):
    """The activity never waits inside the item's transaction (no lock cycle with a sleeper or a suspend): with
    the instance's row held elsewhere the item commits, the activity waits for the row, then the delivery."""
    tenant, stub = stub_tenant(operator)
    instance = AgentInstance.objects.get(tenant=tenant)
    before = instance.last_activity_at
    result: dict[str, object] = {}
    try:
        with psycopg.connect(connection.connection.info.dsn,
                             password=connection.settings_dict.get("PASSWORD") or None) as holder:
            holder.execute("SELECT 1 FROM provisioning_agentinstance WHERE id = %s FOR UPDATE", [instance.pk])

            def send() -> None:
                try:
                    result["resp"] = post_json(api, f"/api/v1/tenants/{tenant.pk}/threads/t/messages",
                                               {"content": "hello"})
                finally:
                    connection.close()

            sender = threading.Thread(target=send)
            sender.start()
            deadline = time.monotonic() + 20
            while not InboxItem.objects.filter(tenant=tenant).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            item = InboxItem.objects.get(tenant=tenant)  # committed while the row is still held
            assert item.status == InboxStatus.PENDING and sender.is_alive()
            holder.rollback()
        sender.join(20)
    finally:
        stub.stop()
    assert result["resp"].status_code == 201, result["resp"].content  # type: ignore[attr-defined]
    instance.refresh_from_db()
    assert instance.last_activity_at is not None and (before is None or instance.last_activity_at > before)
    item.refresh_from_db()
    assert item.status == InboxStatus.DELIVERED


def test_a_revoked_operator_token_is_refused_by_the_tenant_api_at_once(operator, make_token):
    from rest_framework.test import APIClient

    from tenants.actors import SYSTEM
    from tenants.tokens import operator_token_revoke

    tenant, stub = stub_tenant(operator)
    raw = make_token(operator)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    url = f"/api/v1/tenants/{tenant.pk}/threads/t/messages"
    try:
        assert post_json(client, url, {"content": "hi"}).status_code == 201
        operator_token_revoke(operator=operator, prefix=raw.split("_")[1], actor=SYSTEM)
        refused = post_json(client, url, {"content": "hi"})
    finally:
        stub.stop()
    assert refused.status_code == 401
    assert refused["Content-Type"].startswith("application/problem+json")


def test_inbox_item_data_is_what_its_serializer_says(api, operator):
    """``inbox_item_data`` builds the answer's ``inbox`` without instantiating ``InboxItemOutput`` (its fields are
    deep-copied per instance): the two must stay equal, pending and delivered."""
    from conversations.api.serializers import InboxItemOutput, inbox_item_data

    tenant, stub = stub_tenant(operator)
    try:
        _send(api, tenant, 0)
        stub.down = True
        queued = post_json(api, f"/api/v1/tenants/{tenant.pk}/threads/t/messages", {"content": "later"})
        assert queued.status_code == 202
    finally:
        stub.stop()
    items = list(InboxItem.objects.filter(tenant=tenant))
    assert {item.status for item in items} == {InboxStatus.DELIVERED, InboxStatus.PENDING}
    for item in items:
        assert inbox_item_data(item) == InboxItemOutput(item).data
