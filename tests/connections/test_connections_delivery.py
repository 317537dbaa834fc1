"""Issue 33, second slice: a connection's token delivered to the tenant's own instance over the internal API
(refreshed first when near expiry), the refresh sweep, and disconnect (RFC 7009 revocation at the provider, the
tokens deleted from the vault). Against the real OAuth 2.0 authorization server of tests/oauth_peer.py and real
instance tokens; the end-to-end run inside a real agent-host is tests/connections/test_connections_instance.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from connections.choices import ConnectionStatus, connection_credential_name
from connections.models import Connection
from connections.services import connection_tokens_read, connections_refresh_due
from connections.tasks import connections_refresh_sweep_task
from controlplane.periodic import PERIODIC_JOBS
from instances.blocked_reasons import blocked_reason_explain
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.connections.test_connections import connect, consent, register, secrets_of, start
from tests.oauth_peer import OAuthPeer
from tests.vault.test_vault_helpers import assert_problem, bearer_client, make_instance, make_tenant
from vault.models import Credential, CredentialVersion
from webhooks.models import Event

pytestmark = pytest.mark.django_db


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True  # the peer is plain http on 127.0.0.1
    with OAuthPeer() as running:
        yield running


def reconnect(api, tenant) -> Connection:  # type: ignore[no-untyped-def]
    """The customer goes through the connect flow again: a new connection row, the newest active one in use."""
    from django.test import Client

    started = start(api, tenant.pk)
    assert started.status_code == 201, started.content
    page = Client().get("/oauth/callback", consent(started.json()["authorization_url"]))
    assert page.status_code == 200, page.content
    return Connection.objects.filter(tenant=tenant).order_by("-created_at").first()  # type: ignore[return-value]


def userinfo(peer: OAuthPeer, access_token: str) -> int:
    """What the provider says of the token now: its userinfo endpoint's status."""
    req = urllib.request.Request(f"{peer.issuer}/userinfo", headers={"Authorization": f"Bearer {access_token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as answer:  # noqa: S310 - the local peer
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def fresh_for_an_hour(connection: Connection) -> None:
    """The peer's tokens live 60 s, under OAUTH_REFRESH_AHEAD_S: say the provider gave an hour, so a delivery
    that should not refresh does not."""
    Connection.objects.filter(pk=connection.pk).update(expires_at=timezone.now() + timedelta(hours=1))


# --- delivery -----------------------------------------------------------------------------------------------------

def test_an_instance_gets_its_own_tenants_token_and_never_another_tenants(api, peer, make_token):
    assert register(api, peer).status_code == 201
    a, b, c = make_tenant(api.operator), make_tenant(api.operator), make_tenant(api.operator)
    conn_a, conn_b = connect(api, peer, a), connect(api, peer, b)
    for each in (conn_a, conn_b):
        fresh_for_an_hour(each)
    instance_a, instance_b, instance_c = (bearer_client(make_instance(t)) for t in (a, b, c))

    got_a = instance_a.get("/internal/v1/connections/acme")
    assert got_a.status_code == 200, got_a.content
    assert got_a["Cache-Control"] == "no-store"
    body = got_a.json()
    assert body["access_token"] == connection_tokens_read(connection=conn_a).access_token
    assert body["provider"] == "acme" and body["account_id"] == "user-alice" and "refresh_token" not in body
    assert userinfo(peer, body["access_token"]) == 200  # a real, current token of the provider's
    got_b = instance_b.get("/internal/v1/connections/acme").json()
    assert got_b["access_token"] == connection_tokens_read(connection=conn_b).access_token != body["access_token"]

    # C has connected nothing: A's and B's connections of the same provider are not C's, by any name.
    for path in ("acme", str(conn_a.pk), connection_credential_name(conn_a.pk), "..%2Facme"):
        refused = instance_c.get(f"/internal/v1/connections/{path}")
        assert refused.status_code == 404, (path, refused.content)
        assert body["access_token"] not in refused.content.decode()
        assert instance_c.head(f"/internal/v1/connections/{path}").status_code == 404
    assert instance_a.head("/internal/v1/connections/acme").status_code == 204
    # Nor through the credential delivery: the tokens' vault name is reserved.
    assert instance_a.get(f"/internal/v1/credentials/{connection_credential_name(conn_a.pk)}").status_code == 404
    # Another operator's customer with its own instance token: nothing.
    other = make_tenant(operator_create(slug="deliv-b", name="B", actor=SYSTEM))
    assert bearer_client(make_instance(other)).get("/internal/v1/connections/acme").status_code == 404
    # No instance token, or an operator's token: refused before any lookup.
    assert APIClient().get("/internal/v1/connections/acme").status_code == 401
    assert bearer_client(make_token(api.operator)).get("/internal/v1/connections/acme").status_code == 401

    delivered = AuditLog.objects.filter(action="connection.deliver", tenant_id=a.pk)
    assert delivered.count() == 1 and delivered.get().data == {"provider": "acme", "refreshed": False, "coalesced": 0}
    assert AuditLog.objects.filter(action="connection.deliver_refused", tenant_id=c.pk).exists()
    for row in AuditLog.objects.all():
        for secret in secrets_of(peer):
            assert secret not in json.dumps(row.data)


def test_a_token_near_expiry_is_refreshed_before_it_is_delivered(api, peer):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)
    first = connection_tokens_read(connection=connection)
    instance = bearer_client(make_instance(tenant))

    got = instance.get("/internal/v1/connections/acme").json()  # 60 s left < OAUTH_REFRESH_AHEAD_S (300 s)
    assert peer.refresh_presented == [first.refresh_token]
    assert got["access_token"] != first.access_token
    assert got["access_token"] == peer.issued[-1]["access_token"]
    assert userinfo(peer, got["access_token"]) == 200
    connection.refresh_from_db()
    assert connection.last_refreshed_at is not None and connection.status == ConnectionStatus.ACTIVE
    assert AuditLog.objects.get(action="connection.deliver").data["refreshed"] is True
    # Fresh now (the new expiry is an hour away): the next delivery sends nothing to the provider.
    fresh_for_an_hour(connection)
    assert instance.get("/internal/v1/connections/acme").json()["access_token"] == got["access_token"]
    assert len(peer.refresh_presented) == 1 and peer.reuse_detected == []


def test_needs_reauth_answers_409_naming_the_provider_until_the_customer_connects_again(api, peer):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    connect(api, peer, tenant)
    instance = bearer_client(make_instance(tenant))
    peer.revoke_all()  # the customer removed the app at the provider

    refused = assert_problem(instance.get("/internal/v1/connections/acme"), 409)
    assert refused["type"].endswith("/connection-needs-reauth")
    assert refused["provider"] == "acme" and refused["connection_status"] == "needs_reauth"
    assert refused["reason"] == "invalid_grant"
    assert instance.head("/internal/v1/connections/acme").status_code == 404
    assert Event.objects.filter(tenant=tenant, type="connection.needs_reauth").exists()
    words = blocked_reason_explain("connection_needs_reauth")
    assert words is not None and "connect" in words.action and "by itself" in words.action

    mended = reconnect(api, tenant)
    assert instance.head("/internal/v1/connections/acme").status_code == 204
    fresh_for_an_hour(mended)
    got = instance.get("/internal/v1/connections/acme")
    assert got.status_code == 200
    assert got.json()["access_token"] == connection_tokens_read(connection=mended).access_token
    assert Connection.objects.filter(tenant=tenant).count() == 2  # the broken one stays, as history


def test_a_provider_that_cannot_be_reached_gets_the_current_token_delivered_until_it_expires(api, peer):
    import socket

    from connections.models import OAuthClient

    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)
    held = connection_tokens_read(connection=connection).access_token
    with socket.socket() as closed:  # a port nobody listens on: the token endpoint is down
        closed.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{closed.getsockname()[1]}/token"
    OAuthClient.objects.filter(pk=connection.oauth_client_id).update(token_endpoint=down)
    instance = bearer_client(make_instance(tenant))

    # Due (60 s left) but not expired: the refresh fails before sending anything, the held token is still good.
    got = instance.get("/internal/v1/connections/acme")
    assert got.status_code == 200 and got.json()["access_token"] == held
    # Expired: nothing usable to hand out; "not now" (the instance retries later), never a token in the error.
    Connection.objects.filter(pk=connection.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    refused = assert_problem(instance.get("/internal/v1/connections/acme"), 502)
    assert refused["type"].endswith("/oauth-provider-unreachable") and held not in json.dumps(refused)
    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.ACTIVE and connection.refresh_sent_at is None
    assert peer.refresh_presented == []


# --- the refresh sweep --------------------------------------------------------------------------------------------

def test_the_sweep_refreshes_only_active_connections_expiring_within_the_window(api, peer):
    assert register(api, peer).status_code == 201
    soon, later, broken = (connect(api, peer, make_tenant(api.operator)) for _ in range(3))
    Connection.objects.filter(pk=soon.pk).update(expires_at=timezone.now() + timedelta(seconds=500))
    fresh_for_an_hour(later)
    Connection.objects.filter(pk=broken.pk).update(status=ConnectionStatus.NEEDS_REAUTH, status_reason="invalid_grant",
                                                   expires_at=timezone.now() - timedelta(seconds=5))
    before = {c.pk: connection_tokens_read(connection=c).refresh_token for c in (soon, later, broken)}

    assert connections_refresh_due(window_s=600) == {"refreshed": 1}
    assert peer.refresh_presented == [before[soon.pk]]  # the other two sent nothing
    soon.refresh_from_db()
    assert soon.expires_at is not None and soon.expires_at > timezone.now() + timedelta(seconds=50)
    assert connection_tokens_read(connection=soon).refresh_token != before[soon.pk]  # rotated, committed
    # Declared the way every beat job is, and the task runs the service with the configured window (600 s).
    job = next(j for j in PERIODIC_JOBS if j.task == "connections.tasks.connections_refresh_sweep_task")
    assert job.interval_s() == 60
    fresh_for_an_hour(soon)
    Connection.objects.filter(pk=later.pk).update(expires_at=timezone.now() + timedelta(seconds=400))
    assert connections_refresh_sweep_task() == {"refreshed": 1}
    assert peer.refresh_presented[-1] == before[later.pk] and peer.reuse_detected == []


# --- disconnect ---------------------------------------------------------------------------------------------------

def test_disconnect_revokes_at_the_provider_deletes_the_tokens_and_the_next_get_fails(api, peer, make_token):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)
    tokens = connection_tokens_read(connection=connection)
    instance = bearer_client(make_instance(tenant))
    fresh_for_an_hour(connection)
    assert instance.get("/internal/v1/connections/acme").status_code == 200
    url = f"/api/v1/tenants/{tenant.pk}/connections/{connection.pk}"

    # Another operator cannot, and learns nothing.
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {make_token(operator_create(slug='disc-b', name='B', actor=SYSTEM))}")
    assert_problem(other.delete(url), 404)
    assert peer.revocations == []

    done = api.delete(url)
    assert done.status_code == 200, done.content
    assert done.json()["provider_revocation"] == "revoked"
    shown = done.json()["connection"]
    assert shown["status"] == "revoked" and shown["status_reason"] == "disconnected"
    # At the provider: the refresh token revoked, which ends its whole grant (the access token asked after it was
    # already gone with it: RFC 7009's 200 for an unknown token, nothing more to revoke).
    assert peer.revocations == [("refresh_token", tokens.refresh_token)]
    assert userinfo(peer, tokens.access_token) == 401
    assert {t.family for t in peer.refresh_tokens.values()} <= peer.revoked_families
    # Here: every version of the tokens deleted from the vault.
    credential = Credential.objects.get(tenant=tenant, name=connection_credential_name(connection.pk))
    assert credential.revoked_at is not None
    assert not CredentialVersion.objects.filter(credential=credential).exists()
    # The instance's next get fails: 409, the customer must connect again.
    refused = assert_problem(instance.get("/internal/v1/connections/acme"), 409)
    assert refused["connection_status"] == "revoked" and refused["reason"] == "disconnected"

    audit = AuditLog.objects.get(action="connection.disconnect", target_id=str(connection.pk))
    assert audit.data == {"provider": "acme", "provider_revocation": "revoked", "versions_deleted": 1}
    event = Event.objects.get(tenant=tenant, type="connection.disconnected")
    assert event.data == {"connection": str(connection.pk), "provider": "acme", "provider_revocation": "revoked"}
    assert AuditLog.objects.filter(action="credential.destroy", tenant_id=tenant.pk).count() == 1

    again = api.delete(url)  # safe to repeat: nothing left to revoke or delete
    assert again.status_code == 200 and again.json()["provider_revocation"] == "nothing_left"
    assert len(peer.revocations) == 1
    for answer in (done, again, api.get(f"/api/v1/tenants/{tenant.pk}/connections")):
        for secret in secrets_of(peer):
            assert secret not in answer.content.decode()


def test_without_a_revocation_endpoint_disconnect_still_deletes_the_tokens(api, peer):
    created = register(api, peer, issuer="", authorization_endpoint=f"{peer.issuer}/authorize",
                       token_endpoint=f"{peer.issuer}/token")
    assert created.status_code == 201 and created.json()["revocation_endpoint"] == ""
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)
    done = api.delete(f"/api/v1/tenants/{tenant.pk}/connections/{connection.pk}")
    assert done.status_code == 200 and done.json()["provider_revocation"] == "unsupported"
    assert peer.revocations == []
    assert not CredentialVersion.objects.filter(credential__tenant=tenant,
                                                credential__name=connection_credential_name(connection.pk)).exists()


def test_a_discovered_client_shows_its_revocation_endpoint(api, peer):
    created = register(api, peer)
    assert created.status_code == 201 and created.json()["revocation_endpoint"] == f"{peer.issuer}/revoke"


# --- the portal ---------------------------------------------------------------------------------------------------

def test_the_portal_lists_connections_and_its_connect_button_runs_the_flow_on_the_operators_host(peer):
    from django.contrib.auth.models import User
    from django.test import Client

    from connections.services import connection_refresh, oauth_client_create
    from portal.models import OperatorMembership

    host = "conn-portal.localhost"
    operator = operator_create(slug="conn-portal", name="Portal op", actor=SYSTEM, domains=[host])
    oauth_client_create(operator=operator, actor=SYSTEM, provider="acme", client_id=peer.client.client_id,
                        client_secret=peer.client.client_secret, issuer=peer.issuer, scopes=["openid", "email"])
    tenant = make_tenant(operator)
    user = User.objects.create_user("conn-admin", password="correct horse battery staple")
    OperatorMembership.objects.create(user=user, operator=operator, role="admin")
    browser = Client(HTTP_HOST=host)
    browser.force_login(user)

    shown = browser.get(f"/customers/{tenant.pk}/")
    page = shown.content.decode()
    assert 'data-testid="connections-card"' in page and "No connected accounts yet." in page
    # The Connect form is answered by a redirect to the provider: the page's form-action names that origin (and
    # keeps the rest of the policy), or a browser stops the redirect (tests/browser/test_connections_portal.py).
    csp = shown["Content-Security-Policy"]
    form_action = next(d.split()[1:] for d in csp.split(";") if d.strip().startswith("form-action"))
    assert form_action == ["'self'", peer.issuer] and "frame-ancestors 'none'" in csp
    assert "Connect acme" in page and "connections-banner" not in page

    started = browser.post(f"/customers/{tenant.pk}/connections/", {"provider": "acme"})
    assert started.status_code == 302 and started["Cache-Control"] == "no-store"
    assert started["Location"].startswith(f"{peer.issuer}/authorize?")
    assert f"redirect_uri=http%3A%2F%2F{host}%2Foauth%2Fcallback" in started["Location"]
    back = consent(started["Location"])
    done = Client(HTTP_HOST=host).get("/oauth/callback", back)  # the customer's browser: no portal session
    assert done.status_code == 200 and "Connected" in done.content.decode()

    page = browser.get(f"/customers/{tenant.pk}/").content.decode()
    assert "user-alice" in page and "s-active" in page
    for secret in secrets_of(peer):
        assert secret not in page
    # The provider refuses the refresh: the page says the customer must connect again.
    peer.revoke_all()
    connection = Connection.objects.get(tenant=tenant)
    assert connection_refresh(connection_id=connection.pk, ahead_s=3600).outcome == "needs_reauth"
    page = browser.get(f"/customers/{tenant.pk}/").content.decode()
    assert 'data-testid="connections-banner"' in page and "acme" in page
    # Another operator's portal cannot start a flow for this customer.
    other_host = "conn-portal-b.localhost"
    other = operator_create(slug="conn-portal-b", name="B", actor=SYSTEM, domains=[other_host])
    intruder = User.objects.create_user("conn-b-admin", password="correct horse battery staple")
    OperatorMembership.objects.create(user=intruder, operator=other, role="admin")
    outsider = Client(HTTP_HOST=other_host)
    outsider.force_login(intruder)
    assert outsider.post(f"/customers/{tenant.pk}/connections/", {"provider": "acme"}).status_code == 404


# --- deprovisioning -----------------------------------------------------------------------------------------------

def test_deprovisioning_a_customer_disconnects_its_accounts_at_the_provider(peer, settings):
    from django.test import Client

    from connections.services import connection_start, oauth_client_create
    from provisioning.models import WorkflowRun, WorkflowStep
    from provisioning.workflows.engine import Outcome, workflow_execute
    from provisioning.workflows.onboarding import tenant_deprovision, tenant_onboard

    settings.PROVISIONING_RUNTIME_DRIVER = "deferred"  # no agent-host: nothing here needs a running agent
    operator = operator_create(slug="conn-deprov", name="Deprov op", actor=SYSTEM)
    client = oauth_client_create(operator=operator, actor=SYSTEM, provider="acme", client_id=peer.client.client_id,
                                 client_secret=peer.client.client_secret, issuer=peer.issuer)
    tenant, _ = tenant_onboard(allow_no_release=True, operator=operator, slug="conn-deprov-a", name="A", actor=SYSTEM)
    assert workflow_execute(str(WorkflowRun.objects.get(tenant=tenant, kind="onboard").pk)) == Outcome.SUCCEEDED
    started = connection_start(tenant=tenant, oauth_client=client, actor=SYSTEM,
                               redirect_uri="http://testserver/oauth/callback")
    assert Client().get("/oauth/callback", consent(started.authorization_url)).status_code == 200
    connection = Connection.objects.get(tenant=tenant)
    tokens = connection_tokens_read(connection=connection)

    tenant_deprovision(tenant=tenant, actor=SYSTEM)
    run = WorkflowRun.objects.get(tenant=tenant, kind="deprovision")
    assert workflow_execute(str(run.pk)) == Outcome.SUCCEEDED
    assert peer.revocations == [("refresh_token", tokens.refresh_token)]
    assert userinfo(peer, tokens.access_token) == 401
    connection.refresh_from_db()
    assert (connection.status, connection.status_reason) == ("revoked", "disconnected")
    assert not CredentialVersion.objects.filter(credential__tenant=tenant).filter(
        credential__name=connection_credential_name(connection.pk)).exists()
    step = WorkflowStep.objects.get(run=run, name="retire_vault")
    assert step.output["connections"] == {"revoked": 1}
