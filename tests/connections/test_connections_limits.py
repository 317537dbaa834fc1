"""Issue 33, the limits on connected accounts: delivery only of the connections the agents of a tenant's release
declare (``Agent(connections=[...])``, read by the release probe at upload), the private-address check on OAuth
URLs, KEK rotation re-wrapping OAuth client secrets, and delivery audit rows coalesced per connection. Against the
real OAuth 2.0 authorization server of tests/oauth_peer.py, real release uploads and real instance tokens.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from connections.models import Connection, OAuthClient
from connections.oauth import OAuthTransportError
from connections.services import connection_refresh, connection_tokens_read
from controlplane.errors import KeyRingMismatch, ValidationFailed
from releases.models import ReleaseAssignment
from releases.services import release_create
from tenants.actors import SYSTEM
from tenants.models import AuditLog
from tenants.services import operator_create
from tests.connections.test_connections import connect, register
from tests.oauth_peer import OAuthPeer
from tests.releases.test_releases_upload import make_wheel
from tests.vault.test_vault_helpers import assert_problem, bearer_client, make_instance, make_tenant, ring_add_version
from vault.rotation import kek_rotate_start, rotation_job_execute
from vault.selectors import kek_ids_in_use

pytestmark = pytest.mark.django_db

DECLARING = """
from agent_runtime.sdk import Agent

mail = Agent("mail", connections=["acme", "crm"])
notes = Agent("notes", connections=["acme"])


@mail.step
def send(ctx):
    return {"token": ctx.connections.get("acme").access_token()}


@notes.step
def note(ctx):
    return {}
"""

SILENT = """
from agent_runtime.sdk import Agent

agent = Agent("silent")


@agent.step
def idle(ctx):
    return {}
"""


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True  # the peer is plain http on 127.0.0.1
    with OAuthPeer() as running:
        yield running


@pytest.fixture
def releases_root(settings) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    root = Path(settings.VAR_DIR) / f"test-releases-{secrets.token_hex(4)}"
    settings.RELEASES_ROOT = root
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    yield root
    shutil.rmtree(root, ignore_errors=True)


def fresh_for_an_hour(connection: Connection) -> None:
    Connection.objects.filter(pk=connection.pk).update(expires_at=timezone.now() + timedelta(hours=1))


def upload(operator, name: str, module: str, entry_points: str):  # type: ignore[no-untyped-def]
    filename, data = make_wheel(name, f"1.0.{secrets.randbelow(10**6)}", module=module, entry_points=entry_points)
    return release_create(operator=operator, actor=SYSTEM, filename=filename, data=data)


# --- 1. only the connections the agents declare --------------------------------------------------------------------


def test_delivery_is_limited_to_the_connections_the_release_declares(api, peer, releases_root):
    declaring = upload(
        api.operator,
        "mail-agent",
        DECLARING,
        "[agent_runtime.agents]\nmail = mail_agent:mail\nnotes = mail_agent:notes\n",
    )
    silent = upload(api.operator, "silent-agent", SILENT, "[agent_runtime.agents]\nsilent = silent_agent:agent\n")
    # The probe read Agent(connections=...) of each kind, merged sorted and unique; the API shows it.
    assert declaring.connections == ["acme", "crm"] and silent.connections == []
    assert api.get(f"/api/v1/releases/{declaring.pk}").json()["connections"] == ["acme", "crm"]

    assert register(api, peer).status_code == 201
    on_declaring, on_silent, on_none = (make_tenant(api.operator) for _ in range(3))
    ReleaseAssignment.objects.create(tenant=on_declaring, release=declaring)
    ReleaseAssignment.objects.create(tenant=on_silent, release=silent)
    connections = {t.pk: connect(api, peer, t) for t in (on_declaring, on_silent, on_none)}
    for each in connections.values():
        fresh_for_an_hour(each)

    declared = bearer_client(make_instance(on_declaring))
    got = declared.get("/internal/v1/connections/acme")
    assert got.status_code == 200, got.content
    assert got.json()["access_token"] == connection_tokens_read(connection=connections[on_declaring.pk]).access_token
    # Declared but not connected: 404 as before.
    assert_problem(declared.get("/internal/v1/connections/crm"), 404)

    # The release's agents did not declare acme: 403 with its own type, whether or not the customer connected it,
    # and never the token; HEAD (the host's resume probe) says not usable either.
    undeclared = bearer_client(make_instance(on_silent))
    refused = undeclared.get("/internal/v1/connections/acme")
    body = assert_problem(refused, 403)
    assert body["type"].endswith("connection-not-declared") and body["provider"] == "acme"
    assert connection_tokens_read(connection=connections[on_silent.pk]).access_token not in refused.content.decode()
    assert undeclared.head("/internal/v1/connections/acme").status_code == 404
    assert (
        AuditLog.objects.filter(
            action="connection.deliver_refused", tenant_id=on_silent.pk, data__reason="not_declared"
        ).count()
        == 1
    )
    assert not AuditLog.objects.filter(action="connection.deliver", tenant_id=on_silent.pk).exists()
    # Not declared by this release, so the name of another tenant's connection is refused the same way.
    assert_problem(declared.get(f"/internal/v1/connections/{connections[on_silent.pk].pk}"), 403)

    # No release: the runtime's installed agents, which declare nothing to check against: the tenant's own.
    assert bearer_client(make_instance(on_none)).get("/internal/v1/connections/acme").status_code == 200

    # Cross-tenant: another operator's customer on a release declaring acme, with nothing connected, gets nothing
    # of anyone's.
    other_op = operator_create(slug=f"lim-{secrets.token_hex(3)}", name="Other", actor=SYSTEM)
    other_release = upload(
        other_op,
        "other-mail-agent",
        DECLARING,
        "[agent_runtime.agents]\nmail = other_mail_agent:mail\nnotes = other_mail_agent:notes\n",
    )
    outsider = make_tenant(other_op)
    ReleaseAssignment.objects.create(tenant=outsider, release=other_release)
    answer = bearer_client(make_instance(outsider)).get("/internal/v1/connections/acme")
    assert_problem(answer, 404)
    for each in connections.values():
        assert connection_tokens_read(connection=each).access_token not in answer.content.decode()


def test_a_bad_connections_declaration_refuses_the_release(api, releases_root):
    bad = SILENT.replace('Agent("silent")', 'Agent("silent", connections=["no spaces allowed"])')
    filename, data = make_wheel(
        "bad-agent", "1.0.0", module=bad, entry_points="[agent_runtime.agents]\nsilent = bad_agent:agent\n"
    )
    with pytest.raises(ValidationFailed, match="connection provider"):
        release_create(operator=api.operator, actor=SYSTEM, filename=filename, data=data)


# --- 2. private addresses ------------------------------------------------------------------------------------------


def test_oauth_urls_resolving_to_private_addresses_are_refused(api, peer, settings):
    def create(provider: str, **urls: str):  # type: ignore[no-untyped-def]
        body = {"provider": provider, "client_id": "c", **urls}
        return api.post("/api/v1/oauth-clients", data=json.dumps(body), content_type="application/json")

    # Registered while private addresses were allowed (the test switch), with a connection.
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)

    settings.OAUTH_ALLOW_PRIVATE_ADDRESSES = False
    # The peer itself (loopback), by discovery and by explicit endpoints; a name resolving to loopback; the cloud
    # metadata address; a private and a shared (CGNAT) range; IPv6 loopback and an IPv4-mapped private address.
    detail = assert_problem(register(api, peer, provider="acme2"), 400)["detail"]
    assert "issuer" in detail and "private" in detail
    for url in (
        "http://127.0.0.1:9/t",
        "http://localhost:9/t",
        "https://169.254.169.254/latest/meta-data",
        "https://10.1.2.3/t",
        "https://100.64.0.1/t",
        "https://[::1]/t",
        "https://[::ffff:192.168.0.1]/t",
        "https://0.0.0.0/t",
    ):
        assert_problem(
            create(f"p{secrets.token_hex(2)}", authorization_endpoint="https://8.8.8.8/a", token_endpoint=url), 400
        )
    assert_problem(
        create(
            "rev",
            authorization_endpoint="https://8.8.8.8/a",
            token_endpoint="https://8.8.8.8/t",
            revocation_endpoint="https://169.254.169.254/r",
        ),
        400,
    )
    # A public literal address passes (nothing is fetched at registration without an issuer).
    assert (
        create("public", authorization_endpoint="https://8.8.8.8/a", token_endpoint="https://8.8.8.8/t").status_code
        == 201
    )
    assert OAuthClient.objects.filter(operator=api.operator).count() == 2  # acme and public

    # Checked again at the moment of a request: the client registered earlier now points at a private address,
    # so the refresh is refused before anything is sent (the peer sees no refresh token) and nothing is spent.
    with pytest.raises(OAuthTransportError, match="private"):
        connection_refresh(connection_id=connection.pk, ahead_s=10**6)
    assert peer.refresh_presented == []
    connection.refresh_from_db()
    assert connection.status == "active" and connection.refresh_sent_at is None

    settings.OAUTH_ALLOW_PRIVATE_ADDRESSES = True
    assert connection_refresh(connection_id=connection.pk, ahead_s=10**6).outcome == "refreshed"


# --- 3. KEK rotation re-wraps client secrets -----------------------------------------------------------------------


def test_kek_rotation_rewraps_client_secrets_and_the_old_key_can_leave_the_ring(api, peer, settings):
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)
    client = OAuthClient.objects.get(operator=api.operator, provider="acme")
    old_ring = settings.VAULT_KEK_KEYRING
    assert client.secret_kek_id == "local:v1"
    blob_before = bytes(client.secret_blob)

    settings.VAULT_KEK_KEYRING = ring_add_version(old_ring, "v2")
    job = kek_rotate_start(actor=SYSTEM)
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    client.refresh_from_db()
    assert client.secret_kek_id == "local:v2" and bytes(client.secret_blob) != blob_before
    job.refresh_from_db()
    assert job.details["rewrapped_secrets"]["oauth_client_secrets"] >= 1
    assert "local:v1" not in kek_ids_in_use()
    # Again: nothing left to re-wrap.
    again = kek_rotate_start(actor=SYSTEM)
    assert rotation_job_execute(str(again.pk)) == "succeeded"
    again.refresh_from_db()
    assert again.details["rewrapped_secrets"]["oauth_client_secrets"] == 0

    # v1 leaves the ring: the refresh still authenticates at the provider with the re-wrapped secret.
    settings.VAULT_KEK_KEYRING = ",".join(
        part for part in settings.VAULT_KEK_KEYRING.split(",") if part.startswith("v2:")
    )
    assert connection_refresh(connection_id=connection.pk, ahead_s=10**6).outcome == "refreshed"
    assert len(peer.refresh_presented) == 1 and peer.reuse_detected == []


def test_a_secret_under_the_old_key_does_not_open_once_the_key_left_the_ring(api, peer, settings):
    """The test above can fail: without the re-wrap, removing v1 breaks the refresh."""
    assert register(api, peer).status_code == 201
    connection = connect(api, peer, make_tenant(api.operator))
    settings.VAULT_KEK_KEYRING = ",".join(
        part for part in ring_add_version(settings.VAULT_KEK_KEYRING, "v2").split(",") if part.startswith("v2:")
    )
    with pytest.raises(KeyRingMismatch):
        connection_refresh(connection_id=connection.pk, ahead_s=10**6)
    assert peer.refresh_presented == []


# --- 4. delivery audit coalesced -----------------------------------------------------------------------------------


def test_deliveries_in_a_loop_write_one_audit_row_per_interval_with_a_count(api, peer, settings):
    settings.OAUTH_DELIVERY_AUDIT_INTERVAL_S = 60
    assert register(api, peer).status_code == 201
    tenant = make_tenant(api.operator)
    connection = connect(api, peer, tenant)
    fresh_for_an_hour(connection)
    instance = bearer_client(make_instance(tenant))

    for _ in range(25):
        assert instance.get("/internal/v1/connections/acme").status_code == 200
    rows = AuditLog.objects.filter(action="connection.deliver", tenant_id=tenant.pk)
    assert rows.count() == 1
    assert rows.get().data == {"provider": "acme", "refreshed": False, "coalesced": 0}
    connection.refresh_from_db()
    assert connection.deliveries_unaudited == 24

    # The window passes: the next delivery writes a row carrying the 24 it stood for.
    Connection.objects.filter(pk=connection.pk).update(delivery_audited_at=timezone.now() - timedelta(seconds=61))
    assert instance.get("/internal/v1/connections/acme").status_code == 200
    assert [r.data["coalesced"] for r in rows.order_by("id")] == [0, 24]
    connection.refresh_from_db()
    assert connection.deliveries_unaudited == 0

    # A delivery that refreshed always gets its own row.
    Connection.objects.filter(pk=connection.pk).update(expires_at=timezone.now() + timedelta(seconds=30))
    assert instance.get("/internal/v1/connections/acme").status_code == 200
    assert rows.order_by("-id").first().data["refreshed"] is True

    # Interval 0: a row per delivery, as before.
    settings.OAUTH_DELIVERY_AUDIT_INTERVAL_S = 0
    fresh_for_an_hour(connection)
    before = rows.count()
    for _ in range(3):
        instance.get("/internal/v1/connections/acme")
    assert rows.count() == before + 3


# --- 5. the portal's Disconnect button -----------------------------------------------------------------------------


def test_the_portals_disconnect_button_confirms_then_revokes_at_the_provider(peer):
    from django.contrib.auth.models import User
    from django.test import Client

    from connections.services import oauth_client_create
    from portal.models import OperatorMembership
    from tests.connections.test_connections import consent
    from tests.connections.test_connections_delivery import userinfo

    host = "conn-disc.localhost"
    operator = operator_create(slug="conn-disc", name="Disconnect op", actor=SYSTEM, domains=[host])
    oauth_client_create(
        operator=operator,
        actor=SYSTEM,
        provider="acme",
        client_id=peer.client.client_id,
        client_secret=peer.client.client_secret,
        issuer=peer.issuer,
        scopes=["openid", "email"],
    )
    tenant = make_tenant(operator)
    admin = User.objects.create_user("disc-admin", password="correct horse battery staple")
    OperatorMembership.objects.create(user=admin, operator=operator, role="admin")
    browser = Client(HTTP_HOST=host, enforce_csrf_checks=True)
    browser.force_login(admin)
    page = browser.get(f"/customers/{tenant.pk}/")
    started = browser.post(
        f"/customers/{tenant.pk}/connections/",
        {"provider": "acme", "csrfmiddlewaretoken": page.cookies["csrftoken"].value},
    )
    assert Client(HTTP_HOST=host).get("/oauth/callback", consent(started["Location"])).status_code == 200
    connection = Connection.objects.get(tenant=tenant)
    access = connection_tokens_read(connection=connection).access_token
    assert userinfo(peer, access) == 200

    card = browser.get(f"/customers/{tenant.pk}/").content.decode()
    url = f"/customers/{tenant.pk}/connections/{connection.pk}/disconnect/"
    assert 'data-testid="connection-disconnect"' in card and url in card
    # The button leads to a confirmation page; looking at it changes nothing.
    confirm = browser.get(url)
    assert confirm.status_code == 200 and "Disconnect acme (user-alice)?" in confirm.content.decode()
    assert 'method="post"' in confirm.content.decode()
    connection.refresh_from_db()
    assert connection.status == "active"
    # A POST without the CSRF token is refused and disconnects nothing.
    assert browser.post(url).status_code == 403
    connection.refresh_from_db()
    assert connection.status == "active" and userinfo(peer, access) == 200
    # A viewer (cannot act) sees no button and cannot post.
    viewer = User.objects.create_user("disc-viewer", password="correct horse battery staple")
    OperatorMembership.objects.create(user=viewer, operator=operator, role="viewer")
    watching = Client(HTTP_HOST=host)
    watching.force_login(viewer)
    assert 'data-testid="connection-disconnect"' not in watching.get(f"/customers/{tenant.pk}/").content.decode()
    assert watching.post(url).status_code in (403, 404)
    connection.refresh_from_db()
    assert connection.status == "active"

    # Confirmed, with the token: revoked at the provider (asserted there), tokens deleted, the card says so.
    done = browser.post(
        url, {"csrfmiddlewaretoken": confirm.cookies.get("csrftoken", page.cookies["csrftoken"]).value}, follow=True
    )
    assert done.status_code == 200
    assert "disconnected: revoked at the provider" in done.content.decode()
    connection.refresh_from_db()
    assert (connection.status, connection.status_reason) == ("revoked", "disconnected")
    assert userinfo(peer, access) == 401
    assert 'data-testid="connection-disconnect"' not in done.content.decode()  # a revoked row has no button
    assert AuditLog.objects.filter(action="connection.disconnect", tenant_id=tenant.pk, actor_kind="user").count() == 1

    # Another operator's member: 404, and nothing happens.
    other_host = "conn-disc-b.localhost"
    other = operator_create(slug="conn-disc-b", name="B", actor=SYSTEM, domains=[other_host])
    intruder = User.objects.create_user("disc-b-admin", password="correct horse battery staple")
    OperatorMembership.objects.create(user=intruder, operator=other, role="admin")
    outsider = Client(HTTP_HOST=other_host)
    outsider.force_login(intruder)
    assert outsider.get(url).status_code == 404 and outsider.post(url).status_code == 404
