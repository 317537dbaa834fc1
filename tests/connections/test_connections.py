"""Issue 33, first slice: operators' OAuth clients, the connect flow (authorization code + PKCE, a single-use state
bound to the customer) and refresh, against a real OAuth 2.0 authorization server (Authlib's, tests/oauth_peer.py)
over HTTP. Tokens and client secrets never appear in an API answer, a callback page, a log record or an audit row.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection as db_connection
from django.test import Client
from django.utils import timezone

from connections.choices import ConnectionStatus, connection_credential_name
from connections.models import ConnectAttempt, Connection, OAuthClient
from connections.services import _client_secret, connection_refresh, connection_tokens_read
from tenants.models import AuditLog
from tests.oauth_peer import OAuthPeer
from tests.vault.test_vault_helpers import assert_problem, make_tenant
from vault.models import Credential, CredentialVersion

pytestmark = pytest.mark.django_db


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True  # the peer is plain http on 127.0.0.1
    with OAuthPeer() as running:
        yield running


def register(api, peer: OAuthPeer, **extra: Any):  # type: ignore[no-untyped-def]
    body = {"provider": "acme", "client_id": peer.client.client_id, "client_secret": peer.client.client_secret,
            "issuer": peer.issuer, "scopes": ["openid", "email", "calendar"], **extra}
    return api.post("/api/v1/oauth-clients", data=json.dumps(body), content_type="application/json")


def start(api, tenant_id: object, provider: str = "acme"):  # type: ignore[no-untyped-def]
    return api.post(f"/api/v1/tenants/{tenant_id}/connections", data=json.dumps({"provider": provider}),
                    content_type="application/json")


def consent(authorization_url: str) -> dict[str, str]:
    """The customer's browser at the provider: the peer grants and redirects back with code and state."""
    # http.client, not httpx: the browser is not the control plane, and its request must not land in the log records
    # the leak test scans (httpx and httpcore log what they fetch).
    url = urlsplit(authorization_url)
    browser = http.client.HTTPConnection(url.netloc, timeout=10)
    browser.request("GET", f"{url.path}?{url.query}")
    answer = browser.getresponse()
    assert answer.status == 302, answer.read()
    location = urlsplit(answer.getheader("Location", ""))
    browser.close()
    assert location.path == "/oauth/callback"
    return {k: v[0] for k, v in parse_qs(location.query).items()}


def connect(api, peer: OAuthPeer, tenant) -> Connection:  # type: ignore[no-untyped-def]
    started = start(api, tenant.pk)
    assert started.status_code == 201, started.content
    page = Client().get("/oauth/callback", consent(started.json()["authorization_url"]))
    assert page.status_code == 200, page.content
    return Connection.objects.get(tenant=tenant)


def secrets_of(peer: OAuthPeer) -> list[str]:
    """Every token the peer issued, and the client secret."""
    found = [peer.client.client_secret]
    for answer in peer.issued:
        found += [answer["access_token"], *([answer["refresh_token"]] if answer.get("refresh_token") else [])]
    return found


# --- OAuth clients ------------------------------------------------------------------------------------------------

def test_a_client_is_discovered_from_its_issuer_and_its_secret_is_write_only_and_wrapped(api, peer):
    created = register(api, peer)
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["authorization_endpoint"] == f"{peer.issuer}/authorize"
    assert body["token_endpoint"] == f"{peer.issuer}/token" and body["userinfo_endpoint"] == f"{peer.issuer}/userinfo"
    assert body["has_client_secret"] is True and "client_secret" not in body
    for answer in (created, api.get("/api/v1/oauth-clients"), api.get(f"/api/v1/oauth-clients/{body['id']}")):
        assert answer.status_code in (200, 201)
        assert peer.client.client_secret.encode() not in answer.content
    row = OAuthClient.objects.get(pk=body["id"])
    assert peer.client.client_secret.encode() not in bytes(row.secret_blob)
    assert _client_secret(row) == peer.client.client_secret
    # Bound to its row: the same wrapped bytes on another client do not unwrap.
    from controlplane.errors import DecryptionFailed

    other = OAuthClient.objects.create(operator=row.operator, provider="copy", client_id="x",
                                       authorization_endpoint=row.authorization_endpoint,
                                       token_endpoint=row.token_endpoint, secret_kek_id=row.secret_kek_id,
                                       secret_blob=bytes(row.secret_blob), secret_fingerprint=row.secret_fingerprint)
    with pytest.raises(DecryptionFailed):
        _client_secret(other)
    audit = AuditLog.objects.get(action="oauth_client.create", target_id=str(row.pk))
    assert peer.client.client_secret not in json.dumps(audit.data)
    assert_problem(register(api, peer), 409)  # one client per provider


def test_endpoints_must_be_https_except_loopback_where_allowed(api, settings):
    def create(**urls: str):  # type: ignore[no-untyped-def]
        body = {"provider": "p", "client_id": "c", **urls}
        return api.post("/api/v1/oauth-clients", data=json.dumps(body), content_type="application/json")

    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True
    assert_problem(create(authorization_endpoint="http://example.com/a", token_endpoint="https://example.com/t"), 400)
    assert_problem(create(authorization_endpoint="https://u:p@example.com/a", token_endpoint="https://e.com/t"), 400)
    assert_problem(create(authorization_endpoint="ftp://example.com/a", token_endpoint="https://e.com/t"), 400)
    assert_problem(create(authorization_endpoint="https://example.com/a"), 400)  # no token endpoint
    assert create(authorization_endpoint="http://127.0.0.1:9/a", token_endpoint="http://localhost:9/t").status_code \
        == 201
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = False
    assert_problem(create(provider="q", authorization_endpoint="http://127.0.0.1:9/a",
                          token_endpoint="https://example.com/t"), 400)
    created = create(provider="r", authorization_endpoint="https://example.com/a", token_endpoint="https://e.com/t")
    assert created.status_code == 201 and created.json()["has_client_secret"] is False


def test_another_operators_clients_are_not_found_and_not_usable(api, peer, make_token):
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    client_id = register(api, peer).json()["id"]
    other_op = operator_create(slug="op-other-oauth", name="Other", actor=SYSTEM)
    other = Client(HTTP_AUTHORIZATION=f"Bearer {make_token(other_op)}")
    assert_problem(other.get(f"/api/v1/oauth-clients/{client_id}"), 404)
    assert other.get("/api/v1/oauth-clients").json() == []
    their_tenant = make_tenant(other_op)
    answer = other.post(f"/api/v1/tenants/{their_tenant.pk}/connections", data=json.dumps({"provider": "acme"}),
                        content_type="application/json")
    assert_problem(answer, 404)
    # ...nor can they start a flow for our customer.
    ours = make_tenant(api.operator)
    assert_problem(other.post(f"/api/v1/tenants/{ours.pk}/connections", data=json.dumps({"provider": "acme"}),
                              content_type="application/json"), 404)


# --- The connect flow ---------------------------------------------------------------------------------------------

def test_full_connect_flow_stores_tokens_in_the_tenants_vault_and_shows_metadata_only(api, peer):
    register(api, peer)
    tenant = make_tenant(api.operator)
    started = start(api, tenant.pk)
    assert started.status_code == 201 and started["Cache-Control"] == "no-store"
    url = urlsplit(started.json()["authorization_url"])
    query = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert query["client_id"] == peer.client.client_id and query["response_type"] == "code"
    # The state is stored as a hash only.
    attempt = ConnectAttempt.objects.get(tenant=tenant)
    assert query["state"] not in attempt.state_sha256

    back = consent(started.json()["authorization_url"])
    page = Client().get("/oauth/callback", back)
    assert page.status_code == 200 and b"Connected" in page.content
    connection = Connection.objects.get(tenant=tenant)
    assert connection.status == ConnectionStatus.ACTIVE and connection.account_id == "user-alice"
    assert connection.scopes == ["openid", "email", "calendar"]
    assert timedelta(seconds=50) < connection.expires_at - timezone.now() <= timedelta(seconds=60)

    tokens = connection_tokens_read(connection=connection)
    assert tokens.access_token == peer.issued[0]["access_token"]
    assert tokens.refresh_token == peer.issued[0]["refresh_token"]
    # Sealed in the tenant's vault: the stored bytes hold neither token.
    credential = Credential.objects.get(tenant=tenant, name=connection_credential_name(connection.pk))
    blob = bytes(CredentialVersion.objects.get(credential=credential, version=1).ciphertext)
    assert tokens.access_token.encode() not in blob and tokens.refresh_token.encode() not in blob

    listed = api.get(f"/api/v1/tenants/{tenant.pk}/connections")
    assert listed.status_code == 200
    (shown,) = listed.json()
    assert shown["provider"] == "acme" and shown["account_id"] == "user-alice" and shown["status"] == "active"
    assert set(shown) == {"id", "provider", "end_user", "account_id", "scopes", "status", "status_reason",
                          "expires_at", "last_refreshed_at", "created_at"}
    assert shown["end_user"] is None  # started without one: the customer's own, tenant-wide
    # Neither the operator's credential list nor an instance's credential delivery reach the tokens.
    assert b"system." not in api.get(f"/api/v1/tenants/{tenant.pk}/credentials").content
    for answer in (started, page, listed):
        for secret in secrets_of(peer):
            assert secret.encode() not in answer.content


def test_a_replayed_state_is_refused_and_stores_nothing_more(api, peer):
    register(api, peer)
    tenant = make_tenant(api.operator)
    back = consent(start(api, tenant.pk).json()["authorization_url"])
    assert Client().get("/oauth/callback", back).status_code == 200
    issued = len(peer.issued)
    again = Client().get("/oauth/callback", back)
    assert again.status_code == 400 and b"Not connected" in again.content
    assert Connection.objects.filter(tenant=tenant).count() == 1
    assert len(peer.issued) == issued  # the code was not even sent again
    assert AuditLog.objects.filter(action="connection.refused", tenant=tenant, data__reason="used").exists()


def test_an_unknown_or_expired_state_is_refused(api, peer):
    register(api, peer)
    tenant = make_tenant(api.operator)
    back = consent(start(api, tenant.pk).json()["authorization_url"])
    assert Client().get("/oauth/callback", {**back, "state": back["state"] + "x"}).status_code == 400
    assert Client().get("/oauth/callback", {"code": back["code"]}).status_code == 400
    ConnectAttempt.objects.filter(tenant=tenant).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert Client().get("/oauth/callback", back).status_code == 400
    assert not Connection.objects.filter(tenant=tenant).exists() and peer.issued == []


def test_a_declined_consent_uses_the_state_up(api, peer):
    register(api, peer)
    tenant = make_tenant(api.operator)
    back = consent(start(api, tenant.pk).json()["authorization_url"])
    declined = Client().get("/oauth/callback", {"error": "access_denied", "state": back["state"]})
    assert declined.status_code == 400 and b"access_denied" in declined.content
    assert Client().get("/oauth/callback", back).status_code == 400  # the state went with the decline
    assert not Connection.objects.filter(tenant=tenant).exists()


def test_a_state_started_for_tenant_a_is_refused_for_tenant_b(api, peer, make_token):
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    register(api, peer)
    tenant_a, tenant_b = make_tenant(api.operator), make_tenant(api.operator)
    back = consent(start(api, tenant_a.pk).json()["authorization_url"])

    def complete(client, tenant):  # type: ignore[no-untyped-def]
        return client.post(f"/api/v1/tenants/{tenant.pk}/connections/complete", data=json.dumps(back),
                           content_type="application/json")

    assert_problem(complete(api, tenant_b), 400)  # same operator, other customer
    other_op = operator_create(slug="op-b-oauth", name="B", actor=SYSTEM)
    other = Client(HTTP_AUTHORIZATION=f"Bearer {make_token(other_op)}")
    assert_problem(complete(other, make_tenant(other_op)), 400)  # another operator's customer
    assert_problem(complete(other, tenant_a), 404)  # another operator naming ours
    assert not Connection.objects.exists() and peer.issued == []
    refused = AuditLog.objects.filter(action="connection.refused", data__reason="state_of_another_tenant")
    assert refused.count() == 2
    # Not consumed by the attempts: A's own completion still works.
    done = complete(api, tenant_a)
    assert done.status_code == 201, done.content
    assert done.json()["provider"] == "acme" and Connection.objects.get().tenant == tenant_a


def test_a_state_presented_at_another_operators_callback_is_refused_and_stores_nothing(api, peer):
    """The callback is served on every operator's portal host too. A flow started here comes back only to its own
    redirect URI (the provider sends it nowhere else); the same state and code presented at another operator's
    portal host is refused there, exchanges nothing, stores nothing, and is not consumed."""
    from tenants.actors import SYSTEM
    from tenants.services import operator_create

    register(api, peer)
    tenant = make_tenant(api.operator)
    back = consent(start(api, tenant.pk).json()["authorization_url"])
    elsewhere = "conn-elsewhere.localhost"
    operator_create(slug="conn-elsewhere", name="Elsewhere", actor=SYSTEM, domains=[elsewhere])
    refused = Client(HTTP_HOST=elsewhere).get("/oauth/callback", back)
    assert refused.status_code == 400 and b"Not connected" in refused.content
    declined = Client(HTTP_HOST=elsewhere).get("/oauth/callback", {"error": "access_denied", "state": back["state"]})
    assert declined.status_code == 400
    assert not Connection.objects.exists() and not Credential.objects.filter(tenant=tenant).exists()
    assert peer.issued == []  # the code never reached the token endpoint
    assert AuditLog.objects.filter(action="connection.refused", tenant=tenant,
                                   data__reason="callback_of_another_host").count() == 2
    done = Client().get("/oauth/callback", back)  # the flow's own callback still works
    assert done.status_code == 200 and Connection.objects.get().tenant == tenant


def test_a_customer_token_connects_its_own_customers_account_and_no_other(api, peer):
    """The operator's front end, holding a customer token with ``connections:write``, starts and completes the
    flow for its customer; the token cannot name another customer (404, audited), a token without the scope is
    refused (403), and the operator-only endpoints stay closed to it (401)."""
    register(api, peer)
    tenant, other = make_tenant(api.operator), make_tenant(api.operator)

    def customer(scopes: list[str]) -> Client:
        minted = api.post(f"/api/v1/tenants/{tenant.pk}/customer-tokens", data=json.dumps({"scopes": scopes}),
                          content_type="application/json")
        assert minted.status_code == 201, minted.content
        return Client(HTTP_AUTHORIZATION=f"Bearer {minted.json()['token']}")

    front = customer(["connections:read", "connections:write"])
    started = start(front, tenant.pk)
    assert started.status_code == 201, started.content
    back = consent(started.json()["authorization_url"])
    assert_problem(front.post(f"/api/v1/tenants/{other.pk}/connections/complete", data=json.dumps(back),
                              content_type="application/json"), 404)
    assert_problem(start(front, other.pk), 404)
    assert AuditLog.objects.filter(action="customer_token.refused", data__reason="another tenant").count() == 2
    done = front.post(f"/api/v1/tenants/{tenant.pk}/connections/complete", data=json.dumps(back),
                      content_type="application/json")
    assert done.status_code == 201, done.content
    assert done.json()["status"] == "active" and done.json()["account_id"] == "user-alice"
    connection = Connection.objects.get()
    assert connection.tenant == tenant
    create = AuditLog.objects.get(action="connection.create", target_id=str(connection.pk))
    assert create.actor_label.startswith("customer token ")
    (listed,) = front.get(f"/api/v1/tenants/{tenant.pk}/connections").json()
    assert listed["id"] == str(connection.pk)

    reader = customer(["connections:read"])
    assert reader.get(f"/api/v1/tenants/{tenant.pk}/connections").status_code == 200
    assert_problem(start(reader, tenant.pk), 403)
    chatter = customer(["conversations:read"])
    assert_problem(chatter.get(f"/api/v1/tenants/{tenant.pk}/connections"), 403)
    # Operator endpoints stay closed: the OAuth clients, disconnect.
    assert_problem(front.get("/api/v1/oauth-clients"), 401)
    assert_problem(front.delete(f"/api/v1/tenants/{tenant.pk}/connections/{connection.pk}"), 401)
    for answer in (started, done):
        for secret in secrets_of(peer):
            assert secret.encode() not in answer.content


def test_a_replayed_code_under_a_fresh_state_is_refused_and_stores_nothing(api, peer):
    """The code of a finished flow, presented again with the state of a new one: the provider refuses it (codes
    are single-use), the new flow stores nothing and its state is spent."""
    register(api, peer)
    tenant = make_tenant(api.operator)
    first = consent(start(api, tenant.pk).json()["authorization_url"])
    assert Client().get("/oauth/callback", first).status_code == 200
    fresh = consent(start(api, tenant.pk).json()["authorization_url"])
    replayed = Client().get("/oauth/callback", {"state": fresh["state"], "code": first["code"]})
    assert replayed.status_code == 502 and b"invalid_grant" in replayed.content
    assert Connection.objects.filter(tenant=tenant).count() == 1 and len(peer.issued) == 1
    assert Client().get("/oauth/callback", fresh).status_code == 400  # the state went with the refusal


def _redeem_without_verifier(peer: OAuthPeer, code: str, redirect_uri: str) -> tuple[int, dict[str, Any]]:
    """An attacker who caught a code sends it to the token endpoint with the client's credentials but no PKCE
    verifier."""
    import base64
    from urllib.parse import urlencode

    url = urlsplit(peer.issuer)
    conn = http.client.HTTPConnection(url.netloc, timeout=10)
    basic = base64.b64encode(f"{peer.client.client_id}:{peer.client.client_secret}".encode()).decode()
    conn.request("POST", "/token", urlencode({"grant_type": "authorization_code", "code": code,
                                               "redirect_uri": redirect_uri}),
                 {"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded"})
    answer = conn.getresponse()
    body = json.loads(answer.read() or b"{}")
    conn.close()
    return answer.status, body


def test_a_code_without_its_pkce_verifier_is_refused_and_stores_nothing(api, peer):
    """PKCE both ways. A code redeemed without the verifier is refused by the provider. A code injected into a
    customer's callback (an attacker's own authorization, under a challenge whose verifier we do not hold) is
    exchanged with the customer's verifier, which does not match: refused, nothing stored for the customer."""
    register(api, peer)
    tenant = make_tenant(api.operator)
    started = start(api, tenant.pk).json()["authorization_url"]
    back = consent(started)
    redirect_uri = parse_qs(urlsplit(started).query)["redirect_uri"][0]
    status, body = _redeem_without_verifier(peer, back["code"], redirect_uri)
    assert status == 400 and body.get("error") in ("invalid_request", "invalid_grant"), body
    assert peer.issued == []

    # The attacker's own authorization: the same client and redirect, a challenge of theirs.
    from connections import oauth

    _, their_challenge = oauth.pkce_pair(oauth.new_state())
    from urllib.parse import urlencode

    query = {k: v[0] for k, v in parse_qs(urlsplit(started).query).items()}
    theirs = consent(f"{peer.issuer}/authorize?" + urlencode({**query, "state": "attacker",
                                                              "code_challenge": their_challenge}))
    victim = consent(start(api, tenant.pk).json()["authorization_url"])
    injected = Client().get("/oauth/callback", {"state": victim["state"], "code": theirs["code"]})
    assert injected.status_code == 502 and b"invalid_grant" in injected.content
    assert not Connection.objects.filter(tenant=tenant).exists() and peer.issued == []
    assert not Credential.objects.filter(tenant=tenant).exists()


def test_the_provider_refusing_the_code_stores_nothing(api, peer):
    register(api, peer)
    tenant = make_tenant(api.operator)
    back = consent(start(api, tenant.pk).json()["authorization_url"])
    peer.codes.clear()  # the provider no longer knows the code (expired on its side)
    page = Client().get("/oauth/callback", back)
    assert page.status_code == 502 and b"invalid_grant" in page.content
    assert not Connection.objects.exists() and not Credential.objects.filter(tenant=tenant).exists()


# --- Refresh ------------------------------------------------------------------------------------------------------

def test_refresh_rotates_and_the_next_refresh_sends_the_new_refresh_token(api, peer):
    register(api, peer)
    connection = connect(api, peer, make_tenant(api.operator))
    first_refresh = peer.issued[0]["refresh_token"]
    assert connection_refresh(connection_id=connection.pk, ahead_s=0).outcome == "fresh"
    assert peer.refresh_presented == []
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)  # the 60 s token is due
    assert outcome.outcome == "refreshed" and outcome.connection.last_refreshed_at is not None
    tokens = connection_tokens_read(connection=outcome.connection)
    assert tokens.access_token == peer.issued[1]["access_token"]
    assert tokens.refresh_token == peer.issued[1]["refresh_token"] != first_refresh
    assert connection_refresh(connection_id=connection.pk, ahead_s=120).outcome == "refreshed"
    assert peer.refresh_presented == [first_refresh, peer.issued[1]["refresh_token"]]
    assert peer.reuse_detected == [] and peer.revoked_families == set()


def test_invalid_grant_marks_the_connection_needs_reauth(api, peer):
    register(api, peer)
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)
    peer.revoke_all()  # the customer removed the app at the provider
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert outcome.outcome == "needs_reauth"
    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.NEEDS_REAUTH and connection.status_reason == "invalid_grant"
    assert connection.refresh_sent_at is None
    (shown,) = api.get(f"/api/v1/tenants/{tenant.pk}/connections").json()
    assert shown["status"] == "needs_reauth" and shown["status_reason"] == "invalid_grant"
    # Not retried: a connection that needs the customer is left alone.
    assert connection_refresh(connection_id=connection.pk, ahead_s=120).outcome == "inactive"
    assert len(peer.refresh_presented) == 1


def test_a_refresh_interrupted_after_sending_is_never_replayed(api, peer):
    """A refresher died between sending and committing (its marker is committed, its lock gone): the next one must
    not send the refresh token the provider may already have rotated."""
    register(api, peer)
    connection = connect(api, peer, make_tenant(api.operator))
    Connection.objects.filter(pk=connection.pk).update(refresh_sent_at=timezone.now())
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert outcome.outcome == "needs_reauth" and outcome.connection.status_reason == "refresh_interrupted"
    assert peer.refresh_presented == []


def test_a_refresh_whose_answer_is_lost_after_sending_ends_needs_reauth_not_replayed(api, peer, settings):
    """The provider got the refresh and rotated, but its answer never came back (our timeout): the refresh token we
    hold is spent. The connection says so, and nothing sends that token again."""
    register(api, peer)
    connection = connect(api, peer, make_tenant(api.operator))
    settings.OAUTH_HTTP_TIMEOUT_S = 0.5
    peer.token_delay_s = 1.5
    outcome = connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert outcome.outcome == "needs_reauth" and outcome.connection.status_reason == "refresh_interrupted"
    peer.token_delay_s = 0.0
    assert connection_refresh(connection_id=connection.pk, ahead_s=120).outcome == "inactive"
    assert peer.refresh_presented == [peer.issued[0]["refresh_token"]] and peer.reuse_detected == []


def test_an_unreachable_token_endpoint_sends_nothing_and_can_be_retried(api, peer):
    register(api, peer)
    connection = connect(api, peer, make_tenant(api.operator))
    OAuthClient.objects.filter(pk=connection.oauth_client_id).update(token_endpoint="http://127.0.0.1:9/token")
    from connections.oauth import OAuthTransportError

    with pytest.raises(OAuthTransportError) as lost:
        connection_refresh(connection_id=connection.pk, ahead_s=120)
    assert lost.value.sent is False
    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.ACTIVE and connection.refresh_sent_at is None
    OAuthClient.objects.filter(pk=connection.oauth_client_id).update(token_endpoint=f"{peer.issuer}/token")
    assert connection_refresh(connection_id=connection.pk, ahead_s=120).outcome == "refreshed"


@pytest.mark.django_db(transaction=True)
def test_concurrent_refreshers_send_the_refresh_token_once(api, peer):
    register(api, peer)
    connection = connect(api, peer, make_tenant(api.operator))
    original = peer.issued[0]["refresh_token"]
    peer.token_delay_s = 1.0  # every refresher arrives while the first one's request is at the provider
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def refresher() -> None:
        try:
            barrier.wait()
            outcomes.append(connection_refresh(connection_id=connection.pk, ahead_s=120).outcome)
        finally:
            db_connection.close()

    threads = [threading.Thread(target=refresher) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["in_flight"] * 5 + ["refreshed"]
    assert peer.refresh_presented == [original]  # asserted at the provider: sent once
    assert peer.reuse_detected == [] and peer.revoked_families == set()
    connection.refresh_from_db()
    assert connection.status == ConnectionStatus.ACTIVE and connection.refresh_sent_at is None
    assert connection_tokens_read(connection=connection).refresh_token == peer.issued[1]["refresh_token"]
    # Later refreshers see a fresh token and send nothing.
    peer.token_delay_s = 0.0
    assert connection_refresh(connection_id=connection.pk, ahead_s=30).outcome == "fresh"
    assert peer.refresh_presented == [original]


def test_no_token_or_client_secret_reaches_a_log_record_an_answer_or_an_audit_row(api, peer, caplog):
    caplog.set_level(logging.DEBUG)
    answers = [register(api, peer)]
    tenant_a, tenant_b = make_tenant(api.operator), make_tenant(api.operator)
    started = start(api, tenant_a.pk)
    back = consent(started.json()["authorization_url"])
    answers += [started, api.post(f"/api/v1/tenants/{tenant_b.pk}/connections/complete", data=json.dumps(back),
                                  content_type="application/json")]
    answers += [Client().get("/oauth/callback", back), Client().get("/oauth/callback", back)]  # success, replay
    connection = Connection.objects.get(tenant=tenant_a)
    connection_refresh(connection_id=connection.pk, ahead_s=120)
    peer.revoke_all()
    connection_refresh(connection_id=connection.pk, ahead_s=120)
    answers += [api.get(f"/api/v1/tenants/{tenant_a.pk}/connections"), api.get("/api/v1/oauth-clients")]
    secrets = secrets_of(peer)
    assert len(secrets) == 5  # the client secret; the access and refresh tokens of the connect and of the refresh
    # Every record of this process except the peer's own (Authlib, in a thread here, logs the tokens it issues at
    # DEBUG): the control plane's, Django's, and the HTTP client's (httpx, httpcore) at DEBUG.
    ours = [r for r in caplog.records if not r.name.startswith(("authlib", "werkzeug"))]
    assert any(r.name.startswith("httpcore") for r in ours)
    logged = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in ours)
    audited = json.dumps(list(AuditLog.objects.values("action", "data", "target_id", "actor_label")), default=str)
    assert "security event" in logged  # the cross-tenant attempt was logged; without its state or code
    for secret in secrets:
        assert secret not in logged and secret not in audited
        for answer in answers:
            assert secret.encode() not in answer.content
    for value in back.values():
        assert value not in logged
