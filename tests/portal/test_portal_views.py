"""Operator portal: host-based operator resolution, membership, and isolation between operators.

Operator A's users can never reach operator B's pages or objects, URL guessing included: 404.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from portal.models import OperatorMembership
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import AuditLog, OperatorToken, Tenant
from tenants.services import operator_create
from tenants.tokens import operator_token_issue
from vault.models import Credential, CredentialVersion
from vault.services import credential_put

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
HOST_A, HOST_B = "portal-a.localhost", "portal-b.example.localhost"


@pytest.fixture
def op_a(db):
    op = operator_create(slug="op-a", name="Alpha Reseller", actor=SYSTEM, domains=[HOST_A])
    op.support_email = "help@alpha.example"
    op.save()
    return op


@pytest.fixture
def op_b(db):
    return operator_create(slug="op-b", name="Beta Reseller", actor=SYSTEM, domains=[HOST_B])


def _member(operator, username: str, role: str = "admin") -> User:
    user = User.objects.create_user(username, password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role=role)
    return user


def _client(user: User | None, host: str, **kwargs) -> Client:
    client = Client(HTTP_HOST=host, **kwargs)
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def alice(op_a) -> User:
    return _member(op_a, "alice")


@pytest.fixture
def bob(op_b) -> User:
    return _member(op_b, "bob")


@pytest.fixture
def b_tenant(op_b) -> Tenant:
    tenant, _ = tenant_onboard(operator=op_b, slug="beta-cust", name="Beta Customer",
                               actor=SYSTEM, allow_no_release=True)
    credential_put(tenant=tenant, name="crm-key", value="b-secret", actor=SYSTEM)
    return tenant


@pytest.fixture
def a_tenant(op_a) -> Tenant:
    tenant, _ = tenant_onboard(operator=op_a, slug="alpha-cust", name="Alpha Customer",
                               actor=SYSTEM, allow_no_release=True)
    return tenant


def test_unknown_host_is_404_everywhere(op_a):
    for path in ("/", "/login/", "/tokens/", "/branding/", "/dashboard/", "/api/v1/tenants"):
        assert Client(HTTP_HOST="nobody.localhost").get(path).status_code == 404, path


def test_anonymous_is_sent_to_the_operator_login(op_a):
    resp = Client(HTTP_HOST=HOST_A).get("/tokens/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/?next=/tokens/")
    page = Client(HTTP_HOST=HOST_A).get("/login/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "Alpha Reseller" in body and "help@alpha.example" in body  # product name and support contact
    assert 'name="csrfmiddlewaretoken"' in body


def test_login_only_for_members_of_the_host_operator(op_a, op_b, alice, bob):
    ok = Client(HTTP_HOST=HOST_A).post("/login/", {"username": "alice", "password": PASSWORD})
    assert ok.status_code == 302 and ok["Location"] == "/"
    for username in ("bob", "nobody"):
        refused = Client(HTTP_HOST=HOST_A).post("/login/", {"username": username, "password": PASSWORD})
        assert refused.status_code == 200 and "correct username and password" in refused.content.decode()
    User.objects.create_superuser("root", password=PASSWORD)
    staff = Client(HTTP_HOST=HOST_A).post("/login/", {"username": "root", "password": PASSWORD})
    assert staff.status_code == 200  # staff are not operator users


def test_a_user_of_another_operator_gets_404_on_every_page(op_a, op_b, bob, a_tenant):
    client = _client(bob, HOST_A)  # bob's session presented on operator A's host
    for path in ("/", "/tokens/", "/branding/", f"/customers/{a_tenant.pk}/", f"/customers/{a_tenant.pk}/live",
                 "/branding/status"):
        assert client.get(path).status_code == 404, path
    assert client.post("/customers/", {"slug": "x", "name": "X", "idempotency_key": "k"}).status_code == 404
    assert not Tenant.objects.filter(slug="x").exists()


def test_customer_ids_of_another_operator_are_404(op_a, alice, b_tenant):
    client = _client(alice, HOST_A)
    base = f"/customers/{b_tenant.pk}"
    assert client.get(f"{base}/").status_code == 404
    assert client.get(f"{base}/live").status_code == 404
    assert client.get(f"{base}/credentials/crm-key/revoke/").status_code == 404
    assert client.post(f"{base}/credentials/crm-key/revoke/").status_code == 404
    assert client.post(f"{base}/credentials/", {"name": "stolen", "value": "x"}).status_code == 404
    assert client.get(f"/customers/{uuid.uuid4()}/").status_code == 404
    assert Credential.objects.get(tenant=b_tenant, name="crm-key").revoked_at is None
    assert not Credential.objects.filter(name="stolen").exists()


def test_token_prefixes_of_another_operator_are_404(op_a, op_b, alice):
    theirs = operator_token_issue(operator=op_b, actor=SYSTEM).token
    client = _client(alice, HOST_A)
    assert client.get(f"/tokens/{theirs.prefix}/revoke/").status_code == 404
    assert client.post(f"/tokens/{theirs.prefix}/revoke/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert theirs.prefix not in client.get("/tokens/").content.decode()


def test_customer_list_shows_only_own_customers_with_search_and_filter(op_a, alice, a_tenant, b_tenant, settings):
    settings.PORTAL_PAGE_SIZE = 1
    tenant_onboard(allow_no_release=True, operator=op_a, slug="alpha-two", name="Second Alpha", actor=SYSTEM)
    client = _client(alice, HOST_A)
    page = client.get("/")
    assert page.status_code == 200
    assert page.context["page"].paginator.count == 2 and page.context["page"].paginator.num_pages == 2
    assert "Beta Customer" not in page.content.decode()
    assert [t.slug for t in client.get("/?q=second").context["page"]] == ["alpha-two"]
    assert client.get("/?status=ready").context["page"].paginator.count == 0
    # A deleted customer is archived: hidden from the list unless asked for.
    Tenant.objects.filter(slug="alpha-two").update(status="deleted")
    assert [t.slug for t in client.get("/").context["page"]] == ["alpha-cust"]
    assert [t.slug for t in client.get("/?status=deleted").context["page"]] == ["alpha-two"]


def test_onboard_through_the_form_uses_the_service_once(op_a, alice):
    client = _client(alice, HOST_A)
    # No default release: refused on the form, with what to do, unless the box says no release is meant.
    refused = client.post("/customers/", {"name": "New Co", "slug": "new-co", "idempotency_key": uuid.uuid4().hex})
    assert refused.status_code == 400 and "You have no default release yet" in refused.content.decode()
    assert 'name="allow_no_release"' in refused.content.decode()
    assert not Tenant.objects.filter(operator=op_a, slug="new-co").exists()
    key = uuid.uuid4().hex
    resp = client.post("/customers/", {"name": "New Co", "slug": "new-co", "idempotency_key": key,
                                       "allow_no_release": "on"})
    tenant = Tenant.objects.get(operator=op_a, slug="new-co")
    assert resp.status_code == 302 and resp["Location"] == f"/customers/{tenant.pk}/"
    again = client.post("/customers/", {"name": "New Co", "slug": "new-co", "idempotency_key": key,
                                        "allow_no_release": "on"})
    assert again.status_code == 302  # a double submit is the same request: one customer
    assert Tenant.objects.filter(operator=op_a, slug="new-co").count() == 1
    assert AuditLog.objects.filter(action="tenant.onboard", tenant=tenant, actor_label__contains="alice").exists()
    detail = client.get(resp["Location"])
    assert detail.status_code == 200 and "New Co" in detail.content.decode()


def test_onboard_errors_are_shown_on_the_form(op_a, alice):
    client = _client(alice, HOST_A)
    resp = client.post("/customers/", {"name": "Bad", "slug": "Not A Slug!", "idempotency_key": "k1"})
    assert resp.status_code == 400
    assert "slug must be 1-63 characters" in resp.content.decode()
    assert not Tenant.objects.filter(operator=op_a).exists()


def test_credentials_are_write_only(op_a, alice, a_tenant):
    client = _client(alice, HOST_A)
    url = f"/customers/{a_tenant.pk}/credentials/"
    resp = client.post(url, {"name": "smtp-password", "value": "hunter2-very-secret"}, follow=True)
    assert resp.status_code == 200
    body = resp.content.decode()
    assert "smtp-password" in body and "hunter2-very-secret" not in body
    assert CredentialVersion.objects.filter(credential__tenant=a_tenant, credential__name="smtp-password").count() == 1
    refused = client.post(url, {"name": "system.db-password", "value": "hunter3-also-secret"})
    assert refused.status_code == 400
    assert "reserved" in refused.content.decode() and "hunter3-also-secret" not in refused.content.decode()
    revoke = f"/customers/{a_tenant.pk}/credentials/smtp-password/revoke/"
    assert client.get(revoke).status_code == 200
    client.post(revoke)
    assert Credential.objects.get(tenant=a_tenant, name="smtp-password").revoked_at is not None


def test_tokens_are_shown_once_and_only_to_admins(op_a, alice):
    member = _member(op_a, "mallory", role="member")
    assert _client(member, HOST_A).get("/tokens/").status_code == 403
    assert _client(member, HOST_A).post("/tokens/", {"name": "x", "scopes": ["tenants:read"]}).status_code == 403
    assert _client(member, HOST_A).get("/branding/").status_code == 403

    client = _client(alice, HOST_A)
    resp = client.post("/tokens/", {"name": "ci", "scopes": ["tenants:read", "tenants:write"]})
    assert resp.status_code == 200
    plaintext = resp.context["issued"]
    assert plaintext.startswith("cpk_") and plaintext in resp.content.decode()
    assert "no-store" in resp["Cache-Control"]
    token = OperatorToken.objects.get(operator=op_a, name="ci")
    assert token.secret_hash not in resp.content.decode()
    later = client.get("/tokens/").content.decode()
    assert plaintext not in later and token.prefix in later
    assert plaintext not in "".join(str(a.data) for a in AuditLog.objects.all())
    client.post(f"/tokens/{token.prefix}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_every_portal_form_requires_csrf(op_a, alice, a_tenant):
    client = _client(alice, HOST_A, enforce_csrf_checks=True)
    posts = {
        "/customers/": {"name": "X", "slug": "x-co", "idempotency_key": "k"},
        f"/customers/{a_tenant.pk}/credentials/": {"name": "n", "value": "v"},
        "/tokens/": {"name": "t", "scopes": ["tenants:read"]},
        "/branding/": {"product_name": "P", "primary_color": "#000000", "background_color": "#ffffff"},
        "/branding/preview": {"product_name": "P", "primary_color": "#000000", "background_color": "#ffffff"},
    }
    for path, data in posts.items():
        assert client.post(path, data).status_code == 403, path
    assert not Tenant.objects.filter(slug="x-co").exists()
    assert not OperatorToken.objects.filter(operator=op_a).exists()


def test_portal_pages_render_the_operators_theme_with_html_neutralized(op_a, alice, a_tenant):
    op_a.product_name = '<script>alert("x")</script>Alpha'
    op_a.primary_color = "#0b5394"
    op_a.save()
    client = _client(alice, HOST_A)
    for path in ("/", f"/customers/{a_tenant.pk}/", "/tokens/", "/branding/"):
        body = client.get(path).content.decode()
        assert "--brand-primary:#0b5394" in body, path
        assert '<script>alert("x")' not in body and "&lt;script&gt;" in body, path
        assert "help@alpha.example" in body


def test_logout_needs_post(op_a, alice):
    client = _client(alice, HOST_A)
    assert client.get("/logout/").status_code == 405
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302
