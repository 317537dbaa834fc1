"""Issue 8.2: who may call what. Every URL pattern of the control-plane URLconf and the portal URLconf
(API, internal instance endpoints, dashboard, portal, admin) x every actor, against a table of the exact
set of actors allowed. A pattern missing from the table fails ``test_every_url_pattern_is_classified``:
a new URL must be classified here before it can ship.

"Allowed" means the request got past authentication and authorization: any answer except 401, 403, 404,
405 or a redirect to a login page (404 is how another operator's object is refused). 5xx always fails.
Objects in paths are operator A's (its customer, credential, spare token, failed workflow run); B's
actors reaching them is the cross-tenant case. Portal URLs are requested on A's portal host, except by
B's portal admin, who uses B's own host (its strongest position).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from controlplane.liveness import SERVICES, service_beat
from tests.security_world import (
    ACTORS,
    ANON,
    CUST_A,
    INST_A,
    INST_B,
    OP_A,
    OP_A_RO,
    OP_B,
    PORTAL_A_ADMIN,
    PORTAL_A_MEMBER,
    PORTAL_B_ADMIN,
    STAFF,
    STAFF_ALL,
    STAFF_VIEWER,
    SUPERUSER,
    World,
    json_body,
    shared_world,
)

pytestmark = pytest.mark.django_db

ALL = frozenset(ACTORS)
NOBODY: frozenset[str] = frozenset()
CONTROL, PORTAL = "controlplane.urls", "portal.urls"


def walk(patterns: list[Any], prefix: str = "") -> list[tuple[str, URLPattern]]:
    found = []
    for p in patterns:
        if isinstance(p, URLResolver):
            found += walk(p.url_patterns, prefix + str(p.pattern))
        else:
            found.append((prefix + str(p.pattern), p))
    return found


def granted(resp: Any) -> bool:
    assert resp.status_code < 500, (resp.status_code, resp.content[:500])
    if resp.status_code in (401, 403, 404, 405):
        return False
    if resp.status_code in (301, 302, 303) and "login" in resp["Location"]:
        return False
    return True


@dataclass(frozen=True)
class Row:
    urlconf: str
    route: str
    method: str
    allowed: frozenset[str]
    path: Callable[[World], str]
    body: Callable[[World, str], dict[str, Any]] | None = None
    logout: bool = False  # logging out is open to anyone: success is the redirect to the login page

    @property
    def id(self) -> str:
        return f"{self.method} {'portal:' if self.urlconf == PORTAL else ''}/{self.route} -> {self.path.__doc__ or ''}"


def p(path: str) -> Callable[[World], str]:
    """A path template: {a} = A's customer id, {run}, {spare} (A's spare token prefix), {sha} (a logo),
    {msg}, {task}, {effect} (a message, a task and an in-doubt effect of A's customer), {ctk} (a spare
    customer token's prefix)."""

    def build(w: World) -> str:
        return path.format(a=w.tenant_a.pk, run=w.failed_run_id, spare=w.spare_token_prefix, sha=w.asset_sha,
                           msg=w.extra["message_id"], task=w.extra["task_id"], effect=w.extra["effect_key"],
                           ctk=w.extra["ctk_spare"])

    build.__doc__ = path.split("/")[-2] if path.endswith("/") else path.rsplit("/", 1)[-1]
    return build


def slug_for(actor: str) -> str:
    return "new-" + "".join(c if c.isalnum() else "-" for c in actor.lower()).strip("-")[:40]


def form(data: dict[str, Any]) -> Callable[[World, str], dict[str, Any]]:
    return lambda w, actor: {"data": {k: (v(actor) if callable(v) else v) for k, v in data.items()}}


def api_json(data: dict[str, Any]) -> Callable[[World, str], dict[str, Any]]:
    return lambda w, actor: json_body({k: (v(actor) if callable(v) else v) for k, v in data.items()})


def slug_for_email(actor: str) -> str:
    return slug_for(actor) + "@example.com"


def invitation_path(w: World) -> str:
    """A pending invitation of operator A (one is made when none is left)."""
    from portal.models import OperatorInvitation

    pending = OperatorInvitation.objects.filter(operator=w.operator_a, accepted_at__isnull=True,
                                                revoked_at__isnull=True).first()
    if pending is None:
        pending = OperatorInvitation.objects.create(operator=w.operator_a, email="invited@example.com",
                                                    token_hash=uuid.uuid4().hex, expires_at=w.tenant_a.created_at
                                                    + timedelta(days=7))
    return f"/team/invitations/{pending.pk}/withdraw/"


def member_path(w: World) -> str:
    """Operator A's portal member (removed by the one allowed POST, which runs last)."""
    from portal.models import OperatorMembership

    membership = OperatorMembership.objects.filter(operator=w.operator_a, role="member").first()
    return f"/team/members/{membership.pk if membership else 999999}/remove/"


def price(template: str) -> Callable[[World], str]:
    """A path to one of operator A's own model prices ({price}); made when none is left (a delete took it)."""

    def build(w: World) -> str:
        from decimal import Decimal

        from usage.models import ModelPrice

        row = ModelPrice.objects.filter(operator=w.operator_a).first() or ModelPrice.objects.create(
            operator=w.operator_a, model="matrix-model", input_usd_per_mtok=Decimal(1), output_usd_per_mtok=Decimal(2))
        return template.format(price=row.pk)

    build.__doc__ = template
    return build


def hook(template: str) -> Callable[[World], str]:
    """A path to operator A's webhook endpoint ({hook}), one of its deliveries ({delivery}) and that
    delivery's event ({event}); made on first use (a public literal address: no DNS, no request is sent)."""

    def build(w: World) -> str:
        from tenants.actors import SYSTEM
        from webhooks.models import WebhookDelivery
        from webhooks.services import endpoint_create, event_record

        delivery = WebhookDelivery.objects.filter(endpoint__operator=w.operator_a,
                                                  endpoint__deleted_at__isnull=True).first()
        if delivery is None:
            endpoint = endpoint_create(operator=w.operator_a, url="https://93.184.216.34/hook", actor=SYSTEM).endpoint
            event = event_record(operator_id=w.operator_a.pk, tenant=w.tenant_a, type="tenant.ready", data={},
                                 endpoints=[endpoint])
            delivery = WebhookDelivery.objects.get(event=event, endpoint=endpoint)
        return template.format(hook=delivery.endpoint_id, delivery=delivery.pk, event=delivery.event_id)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


def _release_a(w: World):  # type: ignore[no-untyped-def]
    from releases.models import AgentRelease

    made, _ = AgentRelease.objects.get_or_create(
        operator=w.operator_a, version="0.1.0",
        defaults={"distribution": "a-agent", "digest": "sha256:" + "0" * 64, "filename": "a.whl",
                  "size_bytes": 1, "artifact_key": "wheels/a.whl", "kinds": {"a": ""}})
    return made


def release(template: str) -> Callable[[World], str]:
    """A path to operator A's release ({release}), A's customer ({a}) and, only when the path names one, a
    paused rollout of the release with no tenant in it ({rollout}): without one, starting a rollout can
    succeed. Made directly (authorization, not validation)."""

    def build(w: World) -> str:
        from releases.models import Rollout

        made = _release_a(w)
        if "{rollout}" not in template:
            return template.format(release=made.pk, a=w.tenant_a.pk)
        rollout = Rollout.objects.filter(operator=w.operator_a).first() or Rollout.objects.create(
            operator=w.operator_a, release=made, canary=1, wave_size=1, soak_s=0, status="paused")
        return template.format(release=made.pk, rollout=rollout.pk, a=w.tenant_a.pk)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


def schedule(template: str) -> Callable[[World], str]:
    """A path to a schedule of A's customer ({schedule}), made on first use (its DELETE row removes it; the
    test's rollback puts it back)."""

    def build(w: World) -> str:
        from schedules.models import Schedule
        from schedules.services import schedule_create
        from tenants.actors import SYSTEM

        made = Schedule.objects.filter(tenant=w.tenant_a).first() or schedule_create(
            tenant=w.tenant_a, name="nightly", cron="0 3 * * *", timezone_name="UTC", at=None,
            task={"kind": "demo", "params": {}}, message=None, actor=SYSTEM)
        return template.format(a=w.tenant_a.pk, schedule=made.pk)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


def schedule_by_key(template: str) -> Callable[[World], str]:
    """A path naming the idempotency key ({key}) of a schedule A's customer's agent made (``ctx.schedule``)."""

    def build(w: World) -> str:
        from schedules.models import Schedule
        from schedules.services import schedule_create
        from tenants.actors import SYSTEM

        key = "eff-matrix"
        if not Schedule.objects.filter(tenant=w.tenant_a, idempotency_key=key).exists():
            schedule_create(tenant=w.tenant_a, name="agent-matrix", cron="0 3 * * *", timezone_name="UTC", at=None,
                            task={"kind": "demo", "params": {}}, message=None, actor=SYSTEM, idempotency_key=key)
        return template.format(key=key)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


def oauth(template: str) -> Callable[[World], str]:
    """A path to operator A's OAuth client ({client}, provider ``matrix``) and A's customer ({a}); made directly
    (authorization, not validation: no provider is asked)."""

    def build(w: World) -> str:
        from connections.models import OAuthClient

        made, _ = OAuthClient.objects.get_or_create(
            operator=w.operator_a, provider="matrix",
            defaults={"client_id": "matrix", "authorization_endpoint": "https://idp.example.com/authorize",
                      "token_endpoint": "https://idp.example.com/token"})
        return template.format(client=made.pk, a=w.tenant_a.pk)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


def connection(template: str, provider: str) -> Callable[[World], str]:
    """A path to an active connection of A's customer ({connection}, {provider}) with tokens in A's vault, made
    directly (no provider is asked: its client has no revocation endpoint and the token expires never)."""

    def build(w: World) -> str:
        import json as _json

        from connections.choices import connection_credential_name
        from connections.models import Connection, OAuthClient
        from tenants.actors import SYSTEM
        from vault.services import credential_put

        client, _ = OAuthClient.objects.get_or_create(
            operator=w.operator_a, provider=provider,
            defaults={"client_id": provider, "authorization_endpoint": "https://idp.example.com/authorize",
                      "token_endpoint": "https://idp.example.com/token"})
        made, created = Connection.objects.get_or_create(tenant=w.tenant_a, oauth_client=client, provider=provider)
        if created:
            credential_put(tenant=w.tenant_a, name=connection_credential_name(made.pk), actor=SYSTEM,
                           value=_json.dumps({"access_token": "matrix-access", "refresh_token": "matrix-refresh"}))
        return template.format(a=w.tenant_a.pk, connection=made.pk, provider=provider)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


def mcp_server(template: str, tenant_level: bool) -> Callable[[World], str]:
    """A path to an MCP server of operator A ({server}): for every customer, or A's customer's own; made directly
    (its DELETE row removes it; the test's rollback puts it back)."""

    def build(w: World) -> str:
        from mcp_servers.models import McpServer

        tenant = w.tenant_a if tenant_level else None
        made, _ = McpServer.objects.get_or_create(operator=w.operator_a, tenant=tenant, name="matrix",
                                                  defaults={"url": "https://mcp.example.com/mcp"})
        return template.format(a=w.tenant_a.pk, server=made.pk)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


def egress_rule(template: str) -> Callable[[World], str]:
    """A path to an egress rule of operator A ({rule}), for all its customers; made directly (its DELETE row
    removes it; the test's rollback puts it back)."""

    def build(w: World) -> str:
        from egress.models import EgressRule

        made, _ = EgressRule.objects.get_or_create(operator=w.operator_a, tenant=None, release=None,
                                                   host="matrix.example.com", port=None)
        return template.format(rule=made.pk)

    build.__doc__ = template.rstrip("/").rsplit("/", 1)[-1]
    return build


T = "api/v1/tenants/<str:tenant_id>"
WH = "api/v1/webhook-endpoints/<str:endpoint_id>"
D = "dashboard/tenants/<uuid:tenant_id>/"
API_READ = frozenset({OP_A, OP_A_RO})
# Conversations and tasks: A's full token and A's customer token; effects, logs, customer tokens: A's full token.
TALK = frozenset({OP_A, CUST_A})
TH = T + "/threads/<str:thread>/messages"
A_MEMBERS = frozenset({PORTAL_A_ADMIN, PORTAL_A_MEMBER})
ADMINS_OWN_HOST = frozenset({PORTAL_A_ADMIN, PORTAL_B_ADMIN})
STAFF_ACTING = frozenset({STAFF, SUPERUSER})
LOGIN = form({"username": "nobody", "password": "wrong"})

ROWS = [
    # --- operator API (token; scope per method; another operator's customer is a 404)
    Row(CONTROL, "api/v1/tenants", "GET", frozenset({OP_A, OP_A_RO, OP_B}), p("/api/v1/tenants")),
    Row(CONTROL, "api/v1/tenants", "POST", frozenset({OP_A, OP_B}), p("/api/v1/tenants"),
        api_json({"slug": slug_for, "name": "New customer", "allow_no_release": True})),
    Row(CONTROL, T, "GET", API_READ, p("/api/v1/tenants/{a}")),
    Row(CONTROL, T, "PATCH", frozenset({OP_A}), p("/api/v1/tenants/{a}"),
        api_json({"metadata": {"crm_id": "matrix"}})),
    # Restart first: it needs a running tenant, and the suspend below leaves A suspended until the resume.
    Row(CONTROL, T + "/restart", "POST", frozenset({OP_A}), p("/api/v1/tenants/{a}/restart")),
    Row(CONTROL, T + "/suspend", "POST", frozenset({OP_A}), p("/api/v1/tenants/{a}/suspend"),
        api_json({"reason": "matrix"})),
    Row(CONTROL, T + "/resume", "POST", frozenset({OP_A}), p("/api/v1/tenants/{a}/resume")),
    Row(CONTROL, "api/v1/plans", "GET", frozenset({OP_A, OP_A_RO, OP_B}), p("/api/v1/plans")),
    # --- usage (operator token with tenants:read; B reading A's customer is a 404)
    Row(CONTROL, "api/v1/usage", "GET", frozenset({OP_A, OP_A_RO, OP_B}), p("/api/v1/usage")),
    Row(CONTROL, T + "/usage", "GET", API_READ, p("/api/v1/tenants/{a}/usage")),
    Row(CONTROL, T + "/usage/limits", "GET", API_READ, p("/api/v1/tenants/{a}/usage/limits")),
    Row(CONTROL, T, "DELETE", frozenset({OP_A}), p("/api/v1/tenants/{a}")),
    Row(CONTROL, T + "/recoveries", "GET", API_READ, p("/api/v1/tenants/{a}/recoveries")),
    Row(CONTROL, T + "/credentials", "GET", API_READ, p("/api/v1/tenants/{a}/credentials")),
    Row(CONTROL, T + "/credentials/<str:name>", "GET", API_READ, p("/api/v1/tenants/{a}/credentials/mail-a")),
    Row(CONTROL, T + "/credentials/<str:name>", "PUT", frozenset({OP_A}),
        p("/api/v1/tenants/{a}/credentials/mail-a"), api_json({"value": "rotated-by-test"})),
    Row(CONTROL, T + "/credentials/<str:name>", "DELETE", frozenset({OP_A}),
        p("/api/v1/tenants/{a}/credentials/mail-a")),
    # --- talking to the agent (operator token with the scope, or the tenant's own customer token)
    Row(CONTROL, T + "/threads/<str:thread>", "GET", TALK, p("/api/v1/tenants/{a}/threads/main")),
    Row(CONTROL, T + "/threads/<str:thread>", "PUT", TALK, p("/api/v1/tenants/{a}/threads/main"),
        api_json({"policy": "enqueue"})),
    Row(CONTROL, TH, "GET", TALK, p("/api/v1/tenants/{a}/threads/main/messages")),
    Row(CONTROL, TH, "POST", TALK, p("/api/v1/tenants/{a}/threads/main/messages"), api_json({"content": "hi"})),
    Row(CONTROL, TH + "/<str:message_id>/reply", "GET", TALK,
        p("/api/v1/tenants/{a}/threads/main/messages/{msg}/reply")),
    Row(CONTROL, T + "/tasks", "GET", TALK, p("/api/v1/tenants/{a}/tasks")),
    Row(CONTROL, T + "/tasks", "POST", TALK, p("/api/v1/tenants/{a}/tasks"), api_json({"kind": "demo"})),
    Row(CONTROL, T + "/tasks/<str:task_id>", "GET", TALK, p("/api/v1/tenants/{a}/tasks/{task}")),
    Row(CONTROL, T + "/tasks/<str:task_id>/cancel", "POST", TALK, p("/api/v1/tenants/{a}/tasks/{task}/cancel")),
    Row(CONTROL, T + "/tasks/<str:task_id>/retry", "POST", TALK, p("/api/v1/tenants/{a}/tasks/{task}/retry")),
    Row(CONTROL, T + "/effects", "GET", frozenset({OP_A}), p("/api/v1/tenants/{a}/effects")),
    Row(CONTROL, T + "/effects/<str:effect_key>/decision", "POST", frozenset({OP_A}),
        p("/api/v1/tenants/{a}/effects/{effect}/decision"), api_json({"decision": "performed"})),
    Row(CONTROL, T + "/logs", "GET", frozenset({OP_A}), p("/api/v1/tenants/{a}/logs")),
    Row(CONTROL, T + "/customer-tokens", "POST", frozenset({OP_A}), p("/api/v1/tenants/{a}/customer-tokens"),
        api_json({"scopes": ["conversations:read"]})),
    Row(CONTROL, T + "/customer-tokens/<str:prefix>", "DELETE", frozenset({OP_A}),
        p("/api/v1/tenants/{a}/customer-tokens/{ctk}")),
    # --- schedules (operator token with tasks:read / tasks:write, or the customer's own customer token)
    Row(CONTROL, T + "/schedules", "GET", TALK, p("/api/v1/tenants/{a}/schedules")),
    Row(CONTROL, T + "/schedules", "POST", TALK, p("/api/v1/tenants/{a}/schedules"),
        api_json({"name": slug_for, "cron": "0 8 * * *", "timezone": "Europe/Paris", "task": {"kind": "demo"}})),
    Row(CONTROL, T + "/schedules/<str:schedule_id>", "GET", TALK,
        schedule("/api/v1/tenants/{a}/schedules/{schedule}")),
    Row(CONTROL, T + "/schedules/<str:schedule_id>", "PATCH", TALK,
        schedule("/api/v1/tenants/{a}/schedules/{schedule}"), api_json({"paused": True})),
    Row(CONTROL, T + "/schedules/<str:schedule_id>", "DELETE", TALK,
        schedule("/api/v1/tenants/{a}/schedules/{schedule}")),
    Row(CONTROL, T + "/schedules/<str:schedule_id>/fires", "GET", TALK,
        schedule("/api/v1/tenants/{a}/schedules/{schedule}/fires")),
    # --- connected accounts (operator token: tenants:read to read, credentials:write to change)
    Row(CONTROL, "api/v1/oauth-clients", "GET", frozenset({OP_A, OP_A_RO, OP_B}), p("/api/v1/oauth-clients")),
    Row(CONTROL, "api/v1/oauth-clients", "POST", frozenset({OP_A, OP_B}), p("/api/v1/oauth-clients"),
        api_json({"provider": slug_for, "client_id": "c", "authorization_endpoint": "https://idp.example.com/a",
                  "token_endpoint": "https://idp.example.com/t"})),
    Row(CONTROL, "api/v1/oauth-clients/<str:client_id>", "GET", API_READ, oauth("/api/v1/oauth-clients/{client}")),
    # The connect flow: also A's customer token (connections:read / connections:write), for its own customer only.
    Row(CONTROL, T + "/connections", "GET", API_READ | {CUST_A}, p("/api/v1/tenants/{a}/connections")),
    Row(CONTROL, T + "/connections", "POST", frozenset({OP_A, CUST_A}), oauth("/api/v1/tenants/{a}/connections"),
        api_json({"provider": "matrix"})),
    # Past authorization, an unknown state is a 400 (tests/connections/test_connections.py covers the real flow).
    # B's token naming A's customer's connection is a 404; a repeated disconnect is still a 200.
    Row(CONTROL, T + "/connections/<str:connection_id>", "DELETE", frozenset({OP_A}),
        connection("/api/v1/tenants/{a}/connections/{connection}", "matrix-gone")),
    Row(CONTROL, T + "/connections/complete", "POST", frozenset({OP_A, CUST_A}),
        p("/api/v1/tenants/{a}/connections/complete"),
        api_json({"state": "unknown", "code": "x"})),
    # The provider's redirect back: open by design, the single-use state is what authorizes it (400 without one).
    Row(CONTROL, "oauth/callback", "GET", ALL, p("/oauth/callback")),
    # --- MCP servers (operator token with tenants:read / tenants:write; B naming A's is a 404)
    Row(CONTROL, "api/v1/mcp-servers", "GET", frozenset({OP_A, OP_A_RO, OP_B}), p("/api/v1/mcp-servers")),
    Row(CONTROL, "api/v1/mcp-servers", "POST", frozenset({OP_A, OP_B}), p("/api/v1/mcp-servers"),
        api_json({"name": slug_for, "url": "https://mcp.example.com/mcp"})),
    Row(CONTROL, "api/v1/mcp-servers/<str:server_id>", "GET", API_READ,
        mcp_server("/api/v1/mcp-servers/{server}", False)),
    Row(CONTROL, "api/v1/mcp-servers/<str:server_id>", "DELETE", frozenset({OP_A}),
        mcp_server("/api/v1/mcp-servers/{server}", False)),
    Row(CONTROL, T + "/mcp-servers", "GET", API_READ, p("/api/v1/tenants/{a}/mcp-servers")),
    Row(CONTROL, T + "/mcp-servers", "POST", frozenset({OP_A}), p("/api/v1/tenants/{a}/mcp-servers"),
        api_json({"name": slug_for, "url": "https://mcp.example.com/mcp"})),
    Row(CONTROL, T + "/mcp-servers/<str:server_id>", "GET", API_READ,
        mcp_server("/api/v1/tenants/{a}/mcp-servers/{server}", True)),
    Row(CONTROL, T + "/mcp-servers/<str:server_id>", "DELETE", frozenset({OP_A}),
        mcp_server("/api/v1/tenants/{a}/mcp-servers/{server}", True)),
    # Egress allow-lists (tenants:read / tenants:write): each operator lists and adds its own; A's rule is A's.
    Row(CONTROL, "api/v1/egress-rules", "GET", frozenset({OP_A, OP_A_RO, OP_B}), p("/api/v1/egress-rules")),
    Row(CONTROL, "api/v1/egress-rules", "POST", frozenset({OP_A, OP_B}), p("/api/v1/egress-rules"),
        api_json({"host": lambda actor: slug_for(actor) + ".example.com"})),
    Row(CONTROL, "api/v1/egress-rules/<str:rule_id>", "GET", API_READ, egress_rule("/api/v1/egress-rules/{rule}")),
    Row(CONTROL, "api/v1/egress-rules/<str:rule_id>", "DELETE", frozenset({OP_A}),
        egress_rule("/api/v1/egress-rules/{rule}")),
    Row(CONTROL, T + "/egress-decisions", "GET", API_READ, p("/api/v1/tenants/{a}/egress-decisions")),
    # The customer's agent as an MCP server: A's token with tasks:read or A's customer token (a ping).
    Row(CONTROL, T + "/mcp", "POST", TALK, p("/api/v1/tenants/{a}/mcp"),
        api_json({"jsonrpc": "2.0", "id": 1, "method": "ping"})),
    # --- events and webhooks (operator token with events:read / webhooks:read / webhooks:write)
    Row(CONTROL, "api/v1/events", "GET", frozenset({OP_A, OP_B}), p("/api/v1/events")),
    Row(CONTROL, "api/v1/events/<str:event_id>", "GET", frozenset({OP_A}), hook("/api/v1/events/{event}")),
    Row(CONTROL, "api/v1/webhook-endpoints", "GET", frozenset({OP_A, OP_B}), p("/api/v1/webhook-endpoints")),
    Row(CONTROL, "api/v1/webhook-endpoints", "POST", frozenset({OP_A, OP_B}), p("/api/v1/webhook-endpoints"),
        api_json({"url": "https://93.184.216.34/hook"})),
    Row(CONTROL, WH, "GET", frozenset({OP_A}), hook("/api/v1/webhook-endpoints/{hook}")),
    Row(CONTROL, WH, "PATCH", frozenset({OP_A}), hook("/api/v1/webhook-endpoints/{hook}"),
        api_json({"description": "changed"})),
    Row(CONTROL, WH, "DELETE", frozenset({OP_A}), hook("/api/v1/webhook-endpoints/{hook}")),
    Row(CONTROL, WH + "/test", "POST", frozenset({OP_A}), hook("/api/v1/webhook-endpoints/{hook}/test")),
    Row(CONTROL, WH + "/deliveries", "GET", frozenset({OP_A}), hook("/api/v1/webhook-endpoints/{hook}/deliveries")),
    Row(CONTROL, "api/v1/webhook-deliveries/<str:delivery_id>/replay", "POST", frozenset({OP_A}),
        hook("/api/v1/webhook-deliveries/{delivery}/replay")),
    # --- agent releases (operator token with releases:read / releases:write); an upload without a file is a
    # 400 past authorization, so the row runs no validation
    Row(CONTROL, "api/v1/releases", "GET", frozenset({OP_A, OP_B}), p("/api/v1/releases")),
    Row(CONTROL, "api/v1/releases", "POST", frozenset({OP_A, OP_B}), p("/api/v1/releases"), form({"notes": "x"})),
    Row(CONTROL, "api/v1/releases/<str:release_id>", "GET", frozenset({OP_A}), release("/api/v1/releases/{release}")),
    Row(CONTROL, "api/v1/releases/default", "GET", frozenset({OP_A, OP_B}), p("/api/v1/releases/default")),
    # B naming A's release is a 404: refused.
    Row(CONTROL, "api/v1/releases/default", "PUT", frozenset({OP_A}), release("/api/v1/releases/default"),
        lambda w, actor: json_body({"release": str(_release_a(w).pk)})),
    Row(CONTROL, T + "/release", "GET", frozenset({OP_A}), release("/api/v1/tenants/{a}/release")),
    Row(CONTROL, T + "/release", "PUT", frozenset({OP_A}), release("/api/v1/tenants/{a}/release"),
        api_json({"pinned": False})),
    # Per-customer agent configuration: operator tokens only (a customer token is refused even for reading).
    Row(CONTROL, T + "/agent-config", "GET", frozenset({OP_A}), p("/api/v1/tenants/{a}/agent-config")),
    Row(CONTROL, T + "/agent-config", "PUT", frozenset({OP_A}), p("/api/v1/tenants/{a}/agent-config"),
        api_json({"overrides": {}})),
    Row(CONTROL, "api/v1/rollouts", "GET", frozenset({OP_A, OP_B}), p("/api/v1/rollouts")),
    Row(CONTROL, "api/v1/rollouts", "POST", frozenset({OP_A}), release("/api/v1/rollouts"),
        lambda w, actor: json_body({"release": str(_release_a(w).pk)})),
    Row(CONTROL, "api/v1/rollouts/<str:rollout_id>", "GET", frozenset({OP_A}), release("/api/v1/rollouts/{rollout}")),
    *[Row(CONTROL, f"api/v1/rollouts/<str:rollout_id>/{action}", "POST", frozenset({OP_A}),
          release(f"/api/v1/rollouts/{{rollout}}/{action}")) for action in ("pause", "resume", "abort", "rollback")],
    # --- internal instance endpoints (instance token; only the caller's own tenant is addressable)
    Row(CONTROL, "internal/v1/credentials/<str:name>", "GET", frozenset({INST_A}),
        p("/internal/v1/credentials/mail-a")),
    Row(CONTROL, "internal/v1/credentials/<str:name>", "HEAD", frozenset({INST_A}),
        p("/internal/v1/credentials/mail-a")),
    # A provider name: only A's own customer has one connected (B's instance finds nothing of A's).
    Row(CONTROL, "internal/v1/connections/<str:provider>", "GET", frozenset({INST_A}),
        connection("/internal/v1/connections/{provider}", "matrix-live")),
    Row(CONTROL, "internal/v1/connections/<str:provider>", "HEAD", frozenset({INST_A}),
        connection("/internal/v1/connections/{provider}", "matrix-live")),
    Row(CONTROL, "internal/v1/object-keys", "GET", frozenset({INST_A, INST_B}), p("/internal/v1/object-keys")),
    # The caller's own tenant's configuration (no tenant in the path: nothing else is addressable).
    Row(CONTROL, "internal/v1/agent-config", "GET", frozenset({INST_A, INST_B}), p("/internal/v1/agent-config")),
    # S3 session renewal names the caller's own tenant; A's instance gets 409 here (this world vends no STS).
    Row(CONTROL, "internal/v1/s3-credentials/<str:tenant_id>", "GET", frozenset({INST_A}),
        p("/internal/v1/s3-credentials/{a}")),
    Row(CONTROL, "internal/v1/heartbeat", "POST", frozenset({INST_A, INST_B}), p("/internal/v1/heartbeat"),
        api_json({"status": "idle", "progress_seq": 1})),
    # ctx.schedule: each instance makes its own tenant's schedules (no tenant in the path); the lookup by key finds
    # only the caller's own (B's instance asking for A's key finds nothing).
    Row(CONTROL, "internal/v1/schedules", "POST", frozenset({INST_A, INST_B}), p("/internal/v1/schedules"),
        api_json({"in_s": 3600, "task": {"kind": "demo"}})),
    Row(CONTROL, "internal/v1/schedules/by-key/<str:key>", "GET", frozenset({INST_A}),
        schedule_by_key("/internal/v1/schedules/by-key/{key}")),
    # --- public and staff-only plumbing
    Row(CONTROL, "metrics", "GET", STAFF_ALL, p("/metrics")),
    Row(CONTROL, "api/schema/", "GET", ALL, p("/api/schema/")),
    Row(CONTROL, "api/docs/", "GET", ALL, p("/api/docs/")),
    Row(CONTROL, "healthz", "GET", ALL, p("/healthz")),
    Row(CONTROL, "readyz", "GET", ALL, p("/readyz")),
    Row(CONTROL, "problems/", "GET", ALL, p("/problems/")),
    Row(CONTROL, "problems/<slug:slug>", "GET", ALL, p("/problems/not-found")),
    Row(CONTROL, "branding/assets/<str:sha256>", "GET", ALL, p("/branding/assets/{sha}")),
    # --- staff dashboard (is_staff to view; each action also needs its permission)
    Row(CONTROL, "dashboard/", "GET", STAFF_ALL, p("/dashboard/")),
    Row(CONTROL, "dashboard/live", "GET", STAFF_ALL, p("/dashboard/live")),
    Row(CONTROL, "dashboard/login/", "GET", ALL, p("/dashboard/login/")),
    Row(CONTROL, "dashboard/login/", "POST", ALL, p("/dashboard/login/"), LOGIN),
    Row(CONTROL, "dashboard/login/", "PUT", ALL, p("/dashboard/login/")),  # Django's FormView treats PUT as POST
    Row(CONTROL, "dashboard/logout/", "POST", ALL, p("/dashboard/logout/"), logout=True),
    Row(CONTROL, "dashboard/tenants/", "GET", STAFF_ALL, p("/dashboard/tenants/")),
    Row(CONTROL, D, "GET", STAFF_ALL, p("/dashboard/tenants/{a}/")),
    Row(CONTROL, D + "live", "GET", STAFF_ALL, p("/dashboard/tenants/{a}/live")),
    Row(CONTROL, D + "runs/<uuid:run_id>/<str:action>/", "GET", STAFF_ACTING,
        p("/dashboard/tenants/{a}/runs/{run}/retry/")),
    Row(CONTROL, D + "runs/<uuid:run_id>/<str:action>/", "POST", STAFF_ACTING,
        p("/dashboard/tenants/{a}/runs/{run}/retry/")),
    *[Row(CONTROL, D + "actions/<str:action>/", "GET", STAFF_ACTING, p(f"/dashboard/tenants/{{a}}/actions/{action}/"))
      for action in ("restart", "kill", "suspend", "resume", "deprovision", "rotate_keys")],
    Row(CONTROL, D + "actions/<str:action>/", "POST", STAFF_ACTING, p("/dashboard/tenants/{a}/actions/suspend/")),
    # The tenant's slug is typed, so an allowed POST really deprovisions (a 400 for a wrong slug also counts as in).
    Row(CONTROL, D + "actions/<str:action>/", "POST", STAFF_ACTING, p("/dashboard/tenants/{a}/actions/deprovision/"),
        lambda w, actor: {"data": {"confirm_slug": w.tenant_a.slug}}),
    # --- a tenant's agent on the dashboard: every staff user reads; talking and deciding need their permission
    Row(CONTROL, D + "threads/<str:thread>/messages", "POST", STAFF_ACTING,
        p("/dashboard/tenants/{a}/threads/main/messages"), form({"content": "hello from staff"})),
    Row(CONTROL, D + "threads/<str:thread>/messages/<str:message_id>/reply", "GET", STAFF_ALL,
        p("/dashboard/tenants/{a}/threads/main/messages/{msg}/reply")),
    Row(CONTROL, D + "schedules/<uuid:schedule_id>/<str:action>/", "POST", STAFF_ACTING,
        schedule("/dashboard/tenants/{a}/schedules/{schedule}/pause/")),
    Row(CONTROL, D + "tasks/", "GET", STAFF_ALL, p("/dashboard/tenants/{a}/tasks/")),
    Row(CONTROL, D + "tasks/<str:task_id>/", "GET", STAFF_ALL, p("/dashboard/tenants/{a}/tasks/{task}/")),
    Row(CONTROL, D + "tasks/<str:task_id>/retry", "POST", STAFF_ACTING, p("/dashboard/tenants/{a}/tasks/{task}/retry"),
        form({"idempotency_key": "k"})),
    Row(CONTROL, D + "tasks/<str:task_id>/cancel", "GET", STAFF_ACTING,
        p("/dashboard/tenants/{a}/tasks/{task}/cancel")),
    Row(CONTROL, D + "tasks/<str:task_id>/cancel", "POST", STAFF_ACTING,
        p("/dashboard/tenants/{a}/tasks/{task}/cancel"), form({"idempotency_key": "k", "confirm": "yes"})),
    Row(CONTROL, D + "logs/", "GET", STAFF_ALL, p("/dashboard/tenants/{a}/logs/")),
    Row(CONTROL, D + "usage/", "GET", STAFF_ALL, p("/dashboard/tenants/{a}/usage/")),
    Row(CONTROL, D + "effects/<str:effect_key>/decide/", "GET", STAFF_ACTING,
        p("/dashboard/tenants/{a}/effects/{effect}/decide/")),
    Row(CONTROL, D + "effects/<str:effect_key>/decide/", "POST", STAFF_ACTING,
        p("/dashboard/tenants/{a}/effects/{effect}/decide/"), form({"decision": "performed", "note": "checked"})),
    Row(CONTROL, "dashboard/effects/", "GET", STAFF_ALL, p("/dashboard/effects/")),
    Row(CONTROL, "dashboard/isolation/", "GET", STAFF_ALL, p("/dashboard/isolation/")),
    Row(CONTROL, "dashboard/recoveries/", "GET", STAFF_ALL, p("/dashboard/recoveries/")),
    Row(CONTROL, "dashboard/events/", "GET", STAFF_ALL, p("/dashboard/events/")),
    Row(CONTROL, "dashboard/fleet/", "GET", STAFF_ALL, p("/dashboard/fleet/")),
    Row(CONTROL, "dashboard/usage/", "GET", STAFF_ALL, p("/dashboard/usage/")),
    Row(CONTROL, "dashboard/rollouts/", "GET", STAFF_ALL, p("/dashboard/rollouts/")),
    Row(CONTROL, "dashboard/rollouts/<uuid:rollout_id>/", "GET", STAFF_ALL,
        release("/dashboard/rollouts/{rollout}/")),
    Row(CONTROL, "dashboard/rollouts/<uuid:rollout_id>/live", "GET", STAFF_ALL,
        release("/dashboard/rollouts/{rollout}/live")),
    # --- operator portal (its own host; members see their operator's customers; admins also tokens, branding)
    Row(PORTAL, "", "GET", A_MEMBERS | {PORTAL_B_ADMIN}, p("/")),
    Row(PORTAL, "login/", "GET", ALL, p("/login/")),
    Row(PORTAL, "login/", "POST", ALL, p("/login/"), LOGIN),
    Row(PORTAL, "login/", "PUT", ALL, p("/login/")),
    Row(PORTAL, "logout/", "POST", ALL, p("/logout/"), logout=True),
    Row(PORTAL, "customers/", "POST", A_MEMBERS | {PORTAL_B_ADMIN}, p("/customers/"),
        form({"name": "New customer", "slug": slug_for, "idempotency_key": lambda a: uuid.uuid4().hex,
              "allow_no_release": "on"})),
    # A GET of the onboarding URL (a refused form's page reloaded) goes back to the customer list.
    Row(PORTAL, "customers/", "GET", A_MEMBERS | {PORTAL_B_ADMIN}, p("/customers/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/", "GET", A_MEMBERS, p("/customers/{a}/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/live", "GET", A_MEMBERS, p("/customers/{a}/live")),
    Row(PORTAL, "customers/<uuid:tenant_id>/credentials/", "POST", A_MEMBERS, p("/customers/{a}/credentials/"),
        form({"name": "crm-key", "value": "v-from-portal"})),
    Row(PORTAL, "customers/<uuid:tenant_id>/mcp-servers/", "POST", A_MEMBERS, p("/customers/{a}/mcp-servers/"),
        form({"name": slug_for, "url": "https://mcp.example.com/mcp", "trust_annotations": "on"})),
    Row(PORTAL, "customers/<uuid:tenant_id>/mcp-servers/<uuid:server_id>/remove/", "GET", A_MEMBERS,
        mcp_server("/customers/{a}/mcp-servers/{server}/remove/", True)),
    Row(PORTAL, "customers/<uuid:tenant_id>/mcp-servers/<uuid:server_id>/remove/", "POST", A_MEMBERS,
        mcp_server("/customers/{a}/mcp-servers/{server}/remove/", True)),
    # No OAuth client named: back to the customer page with a message (past authorization).
    Row(PORTAL, "customers/<uuid:tenant_id>/connections/", "POST", A_MEMBERS, p("/customers/{a}/connections/"),
        form({"provider": "none-such"})),
    # The OAuth redirect back on an operator host: open by design, the single-use state authorizes it.
    Row(PORTAL, "oauth/callback", "GET", ALL, p("/oauth/callback")),
    Row(PORTAL, "customers/<uuid:tenant_id>/connections/<uuid:connection_id>/disconnect/", "GET", A_MEMBERS,
        connection("/customers/{a}/connections/{connection}/disconnect/", "matrix-portal")),
    Row(PORTAL, "customers/<uuid:tenant_id>/connections/<uuid:connection_id>/disconnect/", "POST", A_MEMBERS,
        connection("/customers/{a}/connections/{connection}/disconnect/", "matrix-portal-gone")),
    Row(PORTAL, "customers/<uuid:tenant_id>/credentials/<str:name>/revoke/", "GET", A_MEMBERS,
        p("/customers/{a}/credentials/mail-a/revoke/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/credentials/<str:name>/revoke/", "POST", A_MEMBERS,
        p("/customers/{a}/credentials/mail-a/revoke/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/threads/<str:thread>/messages", "POST", A_MEMBERS,
        p("/customers/{a}/threads/main/messages"), form({"content": "hello from the portal"})),
    Row(PORTAL, "customers/<uuid:tenant_id>/threads/<str:thread>/messages/<str:message_id>/reply", "GET", A_MEMBERS,
        p("/customers/{a}/threads/main/messages/{msg}/reply")),
    Row(PORTAL, "customers/<uuid:tenant_id>/threads/<str:thread>/policy", "POST", A_MEMBERS,
        p("/customers/{a}/threads/main/policy"), form({"policy": "enqueue"})),
    Row(PORTAL, "customers/<uuid:tenant_id>/schedules/", "POST", A_MEMBERS, p("/customers/{a}/schedules/"),
        form({"name": "portal-made", "cron": "0 6 * * *", "timezone": "UTC", "kind": "demo", "params": "{}",
              "catch_up": "latest"})),
    Row(PORTAL, "customers/<uuid:tenant_id>/schedules/<uuid:schedule_id>/<str:action>/", "POST", A_MEMBERS,
        schedule("/customers/{a}/schedules/{schedule}/pause/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/schedules/<uuid:schedule_id>/delete/", "GET", A_MEMBERS,
        schedule("/customers/{a}/schedules/{schedule}/delete/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/schedules/<uuid:schedule_id>/delete/", "POST", A_MEMBERS,
        schedule("/customers/{a}/schedules/{schedule}/delete/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/tasks/", "GET", A_MEMBERS, p("/customers/{a}/tasks/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/tasks/<str:task_id>/", "GET", A_MEMBERS, p("/customers/{a}/tasks/{task}/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/tasks/<str:task_id>/retry", "POST", A_MEMBERS,
        p("/customers/{a}/tasks/{task}/retry"), form({"idempotency_key": "k"})),
    # The confirm page (GET, or a POST without the confirm field), then the confirmed POST.
    Row(PORTAL, "customers/<uuid:tenant_id>/tasks/<str:task_id>/cancel", "GET", A_MEMBERS,
        p("/customers/{a}/tasks/{task}/cancel")),
    Row(PORTAL, "customers/<uuid:tenant_id>/tasks/<str:task_id>/cancel", "POST", A_MEMBERS,
        p("/customers/{a}/tasks/{task}/cancel"), form({"idempotency_key": "k", "confirm": "yes"})),
    # Model prices: every member reads, admins change their operator's own rows (another's is a 404).
    Row(PORTAL, "prices/", "GET", A_MEMBERS | {PORTAL_B_ADMIN}, p("/prices/")),
    Row(PORTAL, "prices/", "POST", ADMINS_OWN_HOST, p("/prices/"),
        form({"model": slug_for, "input_usd_per_mtok": "1", "output_usd_per_mtok": "2"})),
    Row(PORTAL, "prices/<int:price_id>/", "GET", frozenset({PORTAL_A_ADMIN}), price("/prices/{price}/")),
    Row(PORTAL, "prices/<int:price_id>/", "POST", frozenset({PORTAL_A_ADMIN}), price("/prices/{price}/"),
        form({"input_usd_per_mtok": "3", "output_usd_per_mtok": "4"})),
    Row(PORTAL, "prices/<int:price_id>/delete/", "GET", frozenset({PORTAL_A_ADMIN}), price("/prices/{price}/delete/")),
    Row(PORTAL, "prices/<int:price_id>/delete/", "POST", frozenset({PORTAL_A_ADMIN}),
        price("/prices/{price}/delete/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/logs/", "GET", A_MEMBERS, p("/customers/{a}/logs/")),
    Row(PORTAL, "tokens/", "GET", ADMINS_OWN_HOST, p("/tokens/")),
    Row(PORTAL, "tokens/", "POST", ADMINS_OWN_HOST, p("/tokens/"), form({"name": "ci", "scopes": ["tenants:read"]})),
    Row(PORTAL, "tokens/<str:prefix>/revoke/", "GET", frozenset({PORTAL_A_ADMIN}), p("/tokens/{spare}/revoke/")),
    Row(PORTAL, "tokens/<str:prefix>/revoke/", "POST", frozenset({PORTAL_A_ADMIN}), p("/tokens/{spare}/revoke/")),
    # Releases and rollouts (issue 14): every member reads, admins change (docs/portal-releases.md).
    Row(PORTAL, "releases/", "GET", A_MEMBERS | {PORTAL_B_ADMIN}, p("/releases/")),
    # No file: a 400 from the form, past authorization (the real upload is tests/portal/test_portal_releases.py's).
    Row(PORTAL, "releases/upload/", "POST", ADMINS_OWN_HOST, p("/releases/upload/"), form({"notes": "x"})),
    Row(PORTAL, "releases/<uuid:release_id>/default/", "POST", frozenset({PORTAL_A_ADMIN}),
        release("/releases/{release}/default/")),
    Row(PORTAL, "releases/<uuid:release_id>/rollout/", "GET", frozenset({PORTAL_A_ADMIN}),
        release("/releases/{release}/rollout/")),
    Row(PORTAL, "releases/<uuid:release_id>/rollout/", "POST", frozenset({PORTAL_A_ADMIN}),
        release("/releases/{release}/rollout/"), form({"wave_size": 5, "soak_s": 0})),
    Row(PORTAL, "rollouts/", "GET", A_MEMBERS | {PORTAL_B_ADMIN}, p("/rollouts/")),
    Row(PORTAL, "rollouts/<uuid:rollout_id>/", "GET", A_MEMBERS, release("/rollouts/{rollout}/")),
    Row(PORTAL, "rollouts/<uuid:rollout_id>/live", "GET", A_MEMBERS, release("/rollouts/{rollout}/live")),
    Row(PORTAL, "rollouts/<uuid:rollout_id>/actions/<str:action>/", "GET", frozenset({PORTAL_A_ADMIN}),
        release("/rollouts/{rollout}/actions/abort/")),
    # The rollout is paused: resuming it succeeds for the one allowed actor.
    Row(PORTAL, "rollouts/<uuid:rollout_id>/actions/<str:action>/", "POST", frozenset({PORTAL_A_ADMIN}),
        release("/rollouts/{rollout}/actions/resume/")),
    # Unpinning a customer without a release changes nothing, so nobody is restarted.
    Row(PORTAL, "customers/<uuid:tenant_id>/release/", "POST", frozenset({PORTAL_A_ADMIN}),
        p("/customers/{a}/release/"), form({"release": ""})),
    # A's customer runs no release in this world: its form is one JSON object (admins only save).
    Row(PORTAL, "customers/<uuid:tenant_id>/agent-config/", "POST", frozenset({PORTAL_A_ADMIN}),
        p("/customers/{a}/agent-config/"), form({"__overrides__": "{}"})),
    Row(PORTAL, "webhooks/", "GET", ADMINS_OWN_HOST, p("/webhooks/")),
    Row(PORTAL, "webhooks/", "POST", ADMINS_OWN_HOST, p("/webhooks/"), form({"url": "https://93.184.216.34/hook"})),
    Row(PORTAL, "webhooks/<uuid:endpoint_id>/", "GET", frozenset({PORTAL_A_ADMIN}), hook("/webhooks/{hook}/")),
    Row(PORTAL, "webhooks/<uuid:endpoint_id>/test/", "POST", frozenset({PORTAL_A_ADMIN}),
        hook("/webhooks/{hook}/test/")),
    Row(PORTAL, "webhooks/<uuid:endpoint_id>/delete/", "GET", frozenset({PORTAL_A_ADMIN}),
        hook("/webhooks/{hook}/delete/")),
    Row(PORTAL, "webhooks/<uuid:endpoint_id>/delete/", "POST", frozenset({PORTAL_A_ADMIN}),
        hook("/webhooks/{hook}/delete/")),
    Row(PORTAL, "webhooks/deliveries/<uuid:delivery_id>/replay/", "POST", frozenset({PORTAL_A_ADMIN}),
        hook("/webhooks/deliveries/{delivery}/replay/")),
    Row(PORTAL, "branding/", "GET", ADMINS_OWN_HOST, p("/branding/")),
    Row(PORTAL, "branding/", "POST", ADMINS_OWN_HOST, p("/branding/"), form({"product_name": ""})),  # invalid: 400
    Row(PORTAL, "branding/preview", "POST", ADMINS_OWN_HOST, p("/branding/preview"),
        form({"product_name": "Acme", "primary_color": "#1f4b99", "background_color": "#ffffff"})),
    Row(PORTAL, "branding/status", "GET", ADMINS_OWN_HOST, p("/branding/status")),
    Row(PORTAL, "branding/assets/<str:sha256>", "GET", ALL, p("/branding/assets/{sha}")),
    # Portal for a business (issue 17.5): customer actions, the team, invitations, password reset.
    Row(PORTAL, "customers/<uuid:tenant_id>/actions/<str:action>/", "GET", A_MEMBERS,
        p("/customers/{a}/actions/suspend/")),
    Row(PORTAL, "customers/<uuid:tenant_id>/actions/<str:action>/", "POST", A_MEMBERS,
        p("/customers/{a}/actions/suspend/"), form({"reason": "matrix"})),
    Row(PORTAL, "customers/<uuid:tenant_id>/actions/<str:action>/", "GET", frozenset({PORTAL_A_ADMIN}),
        p("/customers/{a}/actions/deprovision/")),
    Row(PORTAL, "team/", "GET", ADMINS_OWN_HOST, p("/team/")),
    Row(PORTAL, "team/", "POST", ADMINS_OWN_HOST, p("/team/"), form({"email": slug_for_email, "role": "member"})),
    Row(PORTAL, "team/invitations/<uuid:invitation_id>/withdraw/", "GET", frozenset({PORTAL_A_ADMIN}),
        invitation_path),
    Row(PORTAL, "team/invitations/<uuid:invitation_id>/withdraw/", "POST", frozenset({PORTAL_A_ADMIN}),
        invitation_path),
    Row(PORTAL, "team/members/<int:membership_id>/remove/", "GET", frozenset({PORTAL_A_ADMIN}), member_path),
    Row(PORTAL, "team/members/<int:membership_id>/remove/", "POST", frozenset({PORTAL_A_ADMIN}), member_path),
    # Anyone holding a link: a forged token gets its 410 page, which is the answer, not a refusal of the caller.
    Row(PORTAL, "invitations/<str:token>/", "GET", ALL, p("/invitations/forged-token/")),
    Row(PORTAL, "invitations/<str:token>/", "POST", ALL, p("/invitations/forged-token/"),
        form({"username": "x", "password1": "y", "password2": "y"})),
    Row(PORTAL, "password-reset/", "GET", ALL, p("/password-reset/")),
    Row(PORTAL, "password-reset/", "POST", ALL, p("/password-reset/"), form({"email": "nobody@example.com"})),
    Row(PORTAL, "password-reset/sent/", "GET", ALL, p("/password-reset/sent/")),
    Row(PORTAL, "password-reset/<uidb64>/<token>/", "GET", ALL, p("/password-reset/MQ/set-password/")),
    Row(PORTAL, "password-reset/<uidb64>/<token>/", "POST", ALL, p("/password-reset/MQ/set-password/")),
    Row(PORTAL, "password-reset/done/", "GET", ALL, p("/password-reset/done/")),
]


def _request(world: World, row: Row, actor: str, method: str | None = None) -> Any:
    client = world.client(actor, portal=row.urlconf == PORTAL)
    kwargs = row.body(world, actor) if row.body is not None and method is None else {}
    return getattr(client, (method or row.method).lower())(row.path(world), **kwargs)


@pytest.fixture(scope="module")
def _module_world(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    # Built once (about 1 s) and never committed; every test rolls back its own writes (tests/security_world.py).
    with shared_world(django_db_blocker) as world:
        yield world


@pytest.fixture
def world(_module_world, settings):  # type: ignore[no-untyped-def]
    # Failed logins still hash once (timing equalisation); a fast hasher keeps 12 actors x 4 login rows quick.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # The effect queue's instance calls run on their own connections, which cannot see this uncommitted world:
    # they would wait out the whole deadline for every staff actor. Who gets in does not depend on it.
    settings.DASHBOARD_EFFECT_QUEUE_DEADLINE_S = 0.2
    # /readyz answers 200 (not 503) only while the worker and beat have fresh heartbeats: this live process's.
    for service in SERVICES:
        service_beat(service, pid=os.getpid(), host=socket.gethostname(), started_at=time.time())
    _module_world.reset()  # as freshly built: stub memory, cached targets, throttle counters
    return _module_world


def test_every_url_pattern_is_classified():
    table = {(row.urlconf, row.route) for row in ROWS}
    for urlconf in (CONTROL, PORTAL):
        routes = {route for route, _ in walk(get_resolver(urlconf).url_patterns)}
        unclassified = {r for r in routes if not r.startswith("admin/")} - {r for c, r in table if c == urlconf}
        assert not unclassified, f"classify these {urlconf} URL patterns in ROWS: {sorted(unclassified)}"
        stale = {r for c, r in table if c == urlconf} - routes
        assert not stale, f"ROWS name patterns that no longer exist: {sorted(stale)}"


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_exactly_the_allowed_actors_get_in(world, row):
    outcome = {}
    # Refused actors first, so the allowed ones (whose requests may change state) come last.
    for actor in sorted(ACTORS, key=lambda a: (a in row.allowed, a)):
        resp = _request(world, row, actor)
        outcome[actor] = resp.status_code == 302 if row.logout else granted(resp)
    got = {actor for actor, ok in outcome.items() if ok}
    assert got == set(row.allowed), f"allowed {sorted(got)}, expected {sorted(row.allowed)}"


@pytest.mark.parametrize("route", sorted({(r.urlconf, r.route) for r in ROWS}), ids=lambda r: f"{r[0]}:/{r[1]}")
def test_methods_outside_the_table_are_refused(world, route):
    rows = [r for r in ROWS if (r.urlconf, r.route) == route]
    listed = {r.method for r in rows}
    actors = (ANON, OP_A, INST_A, STAFF, SUPERUSER, PORTAL_A_ADMIN, PORTAL_B_ADMIN)
    if route[1].endswith("login/"):
        actors = (ANON, OP_A, INST_A)  # a signed-in user is redirected onwards before any method check
    for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - listed:
        for actor in actors:
            resp = _request(world, rows[0], actor, method)
            assert not granted(resp), f"{method} /{route[1]} answered {resp.status_code} to {actor}"


def _admin_kwargs(pattern: URLPattern, world: World) -> dict[str, str]:
    names = set(pattern.pattern.regex.groupindex)
    kwargs: dict[str, str] = {}
    if "app_label" in names:
        kwargs["app_label"] = "tenants"
    if "object_id" in names or "id" in names:
        app_label, _, model_name = (pattern.name or "").partition("_")
        model_name = model_name.rsplit("_", 1)[0]
        try:
            obj = apps.get_model(app_label, model_name).objects.first()
        except LookupError:
            obj = None
        if "content_type_id" in names:
            from django.contrib.contenttypes.models import ContentType

            kwargs["content_type_id"] = str(ContentType.objects.get_for_model(world.tenant_a).pk)
            kwargs["object_id"] = str(world.tenant_a.pk)
        else:
            kwargs["object_id" if "object_id" in names else "id"] = str(obj.pk if obj is not None else 1)
    return kwargs


def test_admin_is_staff_only_and_the_superuser_gets_every_changelist(world):
    admin_patterns = [(route, pat) for route, pat in walk(get_resolver(CONTROL).url_patterns)
                      if route.startswith("admin/")]
    assert len(admin_patterns) > 50
    non_staff = (ANON, OP_A, INST_A, PORTAL_A_ADMIN)
    clients = {actor: world.client(actor) for actor in (*non_staff, STAFF_VIEWER, SUPERUSER)}
    changelists = 0
    for route, pattern in admin_patterns:
        if pattern.name is None:  # the admin's catch-all
            path = "/admin/no-such-page/"
        else:
            path = reverse(f"admin:{pattern.name}", kwargs=_admin_kwargs(pattern, world))
        got = {actor for actor, client in clients.items() if granted(client.get(path))}
        if pattern.name == "login":
            assert got == set(clients), route
        elif pattern.name == "logout":
            # POST only; a GET is sent on to the index (and from there to the login page).
            assert all(client.get(path).status_code in (302, 405) for client in clients.values())
        else:
            assert got <= STAFF_ALL, f"/{route}: {sorted(got - STAFF_ALL)} got into the admin"
        if (pattern.name or "").endswith("_changelist") or pattern.name == "index":
            changelists += 1
            assert SUPERUSER in got, route
    assert changelists > 10
