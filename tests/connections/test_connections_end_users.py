"""Issue 33: connections bound to an end user of the tenant (two people of one customer, each connecting their own
account), against the real OAuth 2.0 authorization server of tests/oauth_peer.py and real instance tokens.

The end user a task acts for is what the operator's API call recorded for it (the inbox item whose id is the task's
id); the instance names its task, never a person. The run inside a real ``agent-host`` is
tests/connections/test_connections_end_users_instance.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from connections.choices import ConnectionStatus, connection_credential_name
from connections.models import Connection
from connections.services import connection_tokens_read
from conversations.services import task_submit
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tests.connections.test_connections import consent, register, secrets_of
from tests.oauth_peer import OAuthPeer
from tests.vault.test_vault_helpers import assert_problem, bearer_client, make_instance, make_tenant
from vault.models import CredentialVersion
from webhooks.models import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True
    with OAuthPeer() as running:
        yield running


def start_for(client, tenant_id: object, end_user: str | None = None):  # type: ignore[no-untyped-def]
    body = {"provider": "acme", **({"end_user": end_user} if end_user is not None else {})}
    return client.post(f"/api/v1/tenants/{tenant_id}/connections", data=json.dumps(body),
                       content_type="application/json")


def connect_as(client, peer: OAuthPeer, tenant, person: str, end_user: str | None) -> Connection:  # type: ignore[no-untyped-def]
    """``person`` signs in at the provider; the flow is started for ``end_user`` of ``tenant``."""
    peer.user = f"{person}@example.com"
    started = start_for(client, tenant.pk, end_user)
    assert started.status_code == 201, started.content
    assert Client().get("/oauth/callback", consent(started.json()["authorization_url"])).status_code == 200
    return Connection.objects.filter(tenant=tenant).order_by("-created_at").first()  # type: ignore[return-value]


def customer_token(api, tenant, end_user: str | None, scopes: list[str] | None = None) -> Client:  # type: ignore[no-untyped-def]
    body = {"scopes": scopes or ["connections:read", "connections:write"],
            **({"end_user": end_user} if end_user is not None else {})}
    minted = api.post(f"/api/v1/tenants/{tenant.pk}/customer-tokens", data=json.dumps(body),
                      content_type="application/json")
    assert minted.status_code == 201, minted.content
    assert minted.json()["end_user"] == end_user
    return Client(HTTP_AUTHORIZATION=f"Bearer {minted.json()['token']}")


def task_for(tenant, end_user: str | None) -> str:  # type: ignore[no-untyped-def]
    """A task the operator's API call sent for ``end_user`` (accepted into the inbox: its id is the task's id)."""
    accepted = task_submit(tenant=tenant, kind="calendar", params={}, idempotency_key=None, actor=SYSTEM,
                           deliver=False, end_user=end_user)
    return str(accepted.item.pk)


def fresh(*connections: Connection) -> None:
    for each in connections:
        Connection.objects.filter(pk=each.pk).update(expires_at=timezone.now() + timedelta(hours=1))


def test_two_end_users_connect_their_own_accounts_and_each_task_gets_only_its_own(api, peer):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    # Alice's flow started by the operator's back end naming her; Bob's by a front end holding his own token.
    alice = connect_as(api, peer, tenant, "alice", "u-alice")
    bob_front = customer_token(api, tenant, "u-bob")
    bob = connect_as(bob_front, peer, tenant, "bob", None)  # the token's end user, without naming it
    fresh(alice, bob)
    assert (alice.end_user, alice.account_id) == ("u-alice", "user-alice")
    assert (bob.end_user, bob.account_id) == ("u-bob", "user-bob")
    created = Event.objects.get(tenant=tenant, type="connection.created", data__connection=str(bob.pk))
    assert created.data["end_user"] == "u-bob"  # the operator's webhook names whose it is
    alice_token = connection_tokens_read(connection=alice).access_token
    bob_token = connection_tokens_read(connection=bob).access_token
    instance = bearer_client(make_instance(tenant))
    task_alice, task_bob, task_tenant = task_for(tenant, "u-alice"), task_for(tenant, "u-bob"), task_for(tenant, None)

    got = instance.get(f"/internal/v1/connections/acme?task={task_alice}")
    assert got.status_code == 200, got.content
    assert got.json()["access_token"] == alice_token and got.json()["account_id"] == "user-alice"
    assert instance.get(f"/internal/v1/connections/acme?task={task_bob}").json()["access_token"] == bob_token
    # The instance cannot name a person: only its task. A made-up parameter changes nothing, or is refused.
    forged = instance.get(f"/internal/v1/connections/acme?task={task_alice}&end_user=u-bob")
    assert bob_token not in forged.content.decode()
    # A task acting for nobody, an unknown task id, no task: the tenant-wide connection, and there is none. The
    # refusal names the provider, not whose.
    for query in (f"?task={task_tenant}", "?task=00000000-0000-0000-0000-000000000000", "?task=nonsense", ""):
        refused = instance.get(f"/internal/v1/connections/acme{query}")
        assert refused.status_code == 404, (query, refused.content)
        assert "u-alice" not in refused.content.decode() and alice_token not in refused.content.decode()
        assert instance.head(f"/internal/v1/connections/acme{query}").status_code == 404
    assert instance.head(f"/internal/v1/connections/acme?task={task_alice}").status_code == 204

    # Listed with their end user: to the operator, to a customer token of the whole customer, and to each end
    # user's own token only their own.
    listed = {c["end_user"]: c for c in api.get(f"/api/v1/tenants/{tenant.pk}/connections").json()}
    assert set(listed) == {"u-alice", "u-bob"} and listed["u-bob"]["account_id"] == "user-bob"
    only = api.get(f"/api/v1/tenants/{tenant.pk}/connections?end_user=u-alice").json()
    assert [c["id"] for c in only] == [str(alice.pk)]
    whole = customer_token(api, tenant, None, ["connections:read"])
    assert {c["end_user"] for c in whole.get(f"/api/v1/tenants/{tenant.pk}/connections").json()} == {"u-alice",
                                                                                                      "u-bob"}
    seen_by_bob = bob_front.get(f"/api/v1/tenants/{tenant.pk}/connections")
    assert [c["id"] for c in seen_by_bob.json()] == [str(bob.pk)] and b"u-alice" not in seen_by_bob.content
    assert_problem(bob_front.get(f"/api/v1/tenants/{tenant.pk}/connections?end_user=u-alice"), 400)
    # Bob's token cannot start a flow for Alice.
    assert_problem(start_for(bob_front, tenant.pk, "u-alice"), 400)
    for row in AuditLog.objects.all():
        for secret in secrets_of(peer):
            assert secret not in json.dumps(row.data)


def test_a_state_started_for_one_end_user_cannot_be_completed_by_anothers_token(api, peer):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    alice_front, bob_front = customer_token(api, tenant, "u-alice"), customer_token(api, tenant, "u-bob")
    started = start_for(alice_front, tenant.pk)
    back = consent(started.json()["authorization_url"])
    stolen = bob_front.post(f"/api/v1/tenants/{tenant.pk}/connections/complete", data=json.dumps(back),
                            content_type="application/json")
    assert_problem(stolen, 400)
    assert not Connection.objects.exists()
    assert AuditLog.objects.filter(action="connection.refused", data__reason="state_of_another_end_user").exists()
    # Not consumed: Alice's own front end completes it.
    done = alice_front.post(f"/api/v1/tenants/{tenant.pk}/connections/complete", data=json.dumps(back),
                            content_type="application/json")
    assert done.status_code == 201, done.content
    assert done.json()["end_user"] == "u-alice"
    assert_problem(start_for(api, tenant.pk, "bad id with spaces"), 400)
    assert_problem(start_for(api, tenant.pk, "x" * 129), 400)


def test_one_end_users_disconnect_leaves_the_others_and_a_reconnect_supersedes(api, peer):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    alice = connect_as(api, peer, tenant, "alice", "u-alice")
    bob = connect_as(api, peer, tenant, "bob", "u-bob")
    fresh(alice, bob)
    instance = bearer_client(make_instance(tenant))
    task_alice, task_bob = task_for(tenant, "u-alice"), task_for(tenant, "u-bob")

    gone = api.delete(f"/api/v1/tenants/{tenant.pk}/connections/{alice.pk}")
    assert gone.status_code == 200, gone.content
    alice.refresh_from_db()
    bob.refresh_from_db()
    assert alice.status == ConnectionStatus.REVOKED and bob.status == ConnectionStatus.ACTIVE
    refused = instance.get(f"/internal/v1/connections/acme?task={task_alice}")
    assert refused.status_code == 409 and refused.json()["provider"] == "acme"
    got = instance.get(f"/internal/v1/connections/acme?task={task_bob}")
    assert got.status_code == 200 and got.json()["access_token"] == connection_tokens_read(connection=bob).access_token

    # Bob connects again: one active connection per (tenant, provider, end user); the old one's tokens are gone.
    again = connect_as(api, peer, tenant, "bob", "u-bob")
    bob.refresh_from_db()
    assert (bob.status, bob.status_reason) == (ConnectionStatus.REVOKED, "superseded")
    assert not CredentialVersion.objects.filter(credential__name=connection_credential_name(bob.pk)).exists()
    assert Connection.objects.filter(tenant=tenant, end_user="u-bob", status="active").get() == again
    fresh(again)
    assert instance.get(f"/internal/v1/connections/acme?task={task_bob}").json()["access_token"] == (
        connection_tokens_read(connection=again).access_token)


def test_no_fallback_to_the_tenant_wide_connection_unless_the_operator_says_so(api, peer):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    company = connect_as(api, peer, tenant, "admin", None)
    fresh(company)
    instance = bearer_client(make_instance(tenant))
    task_carol, task_tenant = task_for(tenant, "u-carol"), task_for(tenant, None)
    assert instance.get(f"/internal/v1/connections/acme?task={task_tenant}").json()["account_id"] == "user-admin"
    refused = instance.get(f"/internal/v1/connections/acme?task={task_carol}")
    assert refused.status_code == 404 and "u-carol" not in refused.content.decode()
    assert instance.head(f"/internal/v1/connections/acme?task={task_carol}").status_code == 404

    company.oauth_client.end_user_fallback = True
    company.oauth_client.save(update_fields=["end_user_fallback"])
    assert instance.get(f"/internal/v1/connections/acme?task={task_carol}").json()["account_id"] == "user-admin"
    # Carol connects her own: hers from then on.
    carol = connect_as(api, peer, tenant, "carol", "u-carol")
    fresh(carol)
    assert instance.get(f"/internal/v1/connections/acme?task={task_carol}").json()["account_id"] == "user-carol"


def test_another_tenants_end_user_with_the_same_id_gets_nothing_of_this_tenants(api, peer):
    assert register(api, peer).status_code == 201
    tenant, other = make_tenant(api.operator), make_tenant(api.operator)
    alice = connect_as(api, peer, tenant, "alice", "u-alice")
    fresh(alice)
    token = connection_tokens_read(connection=alice).access_token
    other_instance = bearer_client(make_instance(other))
    # Its own task for "u-alice", and this tenant's task id: neither reaches this tenant's connection.
    for task in (task_for(other, "u-alice"), task_for(tenant, "u-alice")):
        refused = other_instance.get(f"/internal/v1/connections/acme?task={task}")
        assert refused.status_code == 404 and token not in refused.content.decode()
    other_front = customer_token(api, other, "u-alice")
    assert other_front.get(f"/api/v1/tenants/{other.pk}/connections").json() == []
    assert_problem(other_front.get(f"/api/v1/tenants/{tenant.pk}/connections"), 404)
