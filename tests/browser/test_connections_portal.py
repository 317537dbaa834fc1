"""Issue 33: a customer's account connected from the portal in headless Chromium, end to end against the real
Authlib authorization server of tests/oauth_peer.py with its consent page on: the customer page's Connect
button -> the provider's consent page (Allow) -> the provider redirects the browser to ``/oauth/callback`` on
the operator's portal host -> "Connected" -> the card lists the account as active. Never a token on any page the
browser saw. Then Deny on the consent page: "Not connected", nothing stored.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from connections.models import ConnectAttempt, Connection
from connections.services import connection_tokens_read, oauth_client_create
from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.services import operator_create
from tests.connections.test_connections import secrets_of
from tests.connections.test_connections_delivery import userinfo
from tests.oauth_peer import OAuthPeer
from tests.vault.test_vault_helpers import make_tenant

from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "conn-browser.localhost"


@pytest.fixture
def peer(settings) -> Iterator[OAuthPeer]:  # type: ignore[no-untyped-def]
    settings.OAUTH_ALLOW_HTTP_LOOPBACK = True  # the peer is plain http on 127.0.0.1
    with OAuthPeer(consent_page=True) as running:
        yield running


def test_a_customer_connects_an_account_from_the_portal_through_the_providers_consent_page(page, live_port, peer):
    operator = operator_create(slug="conn-browser", name="Conn Browser", actor=SYSTEM, domains=[HOST])
    oauth_client_create(operator=operator, actor=SYSTEM, provider="acme", client_id=peer.client.client_id,
                        client_secret=peer.client.client_secret, issuer=peer.issuer, scopes=["openid", "email"])
    tenant = make_tenant(operator)
    user = User.objects.create_user("conn-olga", password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role="admin")
    seen: list[str] = []  # every document the browser loaded, to scan for tokens
    page.on("response", lambda r: seen.append(r.text()) if r.request.resource_type == "document"
            and r.status < 300 else None)

    page.goto(f"http://{HOST}:{live_port}/customers/{tenant.pk}/")
    page.get_by_label("Username").fill("conn-olga")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    card = page.get_by_test_id("connections-card")
    expect(card).to_contain_text("No connected accounts yet.")

    # Connect -> the provider's own consent page (another origin), naming the scopes asked for.
    card.get_by_role("button", name="Connect acme").click()
    expect(page.get_by_role("heading", name=f"Authorize {peer.client.client_id}")).to_be_visible()
    assert page.url.startswith(f"{peer.issuer}/authorize?")
    expect(page.locator("#scopes")).to_have_text("openid email")
    screenshot(page, "connections-consent")
    page.get_by_role("button", name="Allow").click()

    # The provider sends the browser back to the callback on the operator's portal host.
    expect(page.get_by_role("heading", name="Connected")).to_be_visible()
    assert page.url.startswith(f"http://{HOST}:{live_port}/oauth/callback?")
    assert peer.consents == ["allow"]
    connection = Connection.objects.get(tenant=tenant)
    assert connection.status == "active" and connection.account_id == "user-alice"
    assert userinfo(peer, connection_tokens_read(connection=connection).access_token) == 200

    page.goto(f"http://{HOST}:{live_port}/customers/{tenant.pk}/")
    row = card.get_by_role("row").filter(has_text="acme")
    expect(row).to_contain_text("user-alice")
    expect(row.locator(".badge")).to_have_text("active")
    screenshot(page, "connections-card")

    # Deny at the provider: the callback says so and nothing more is stored; the state is used up.
    card.get_by_role("button", name="Connect acme").click()
    page.get_by_role("button", name="Deny").click()
    expect(page.get_by_role("heading", name="Not connected")).to_be_visible()
    expect(page.locator("body")).to_contain_text("access_denied")
    assert peer.consents == ["allow", "deny"]
    assert Connection.objects.filter(tenant=tenant).count() == 1 and len(peer.issued) == 1
    assert ConnectAttempt.objects.filter(tenant=tenant, used_at__isnull=True).count() == 0

    assert len(seen) >= 5
    for secret in secrets_of(peer):
        for document in seen:
            assert secret not in document
