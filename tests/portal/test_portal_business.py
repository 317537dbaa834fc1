"""Operator portal for a business (issue 17.5): customer actions, recovery history and usage, team
invitations, password reset, and branding edits that survive a rejection.

Django's test client against real PostgreSQL; mail through Django's locmem outbox where only its content
matters, and a real SMTP server (aiosmtpd) where the configured backend itself is the point. Every action
is also tried on another operator's customer: 404, and nothing changes.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import timedelta

import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.utils import timezone

from branding.choices import RevisionStatus
from branding.models import BrandingRevision
from branding.services import branding_revision_process, branding_submit
from controlplane.ports import free_port
from conversations.choices import InboxKind, InboxStatus
from conversations.models import InboxItem
from portal.models import OperatorInvitation, OperatorMembership
from provisioning.choices import InstanceStatus, RecoveryOutcome, RecoveryReason, WorkflowKind
from provisioning.models import AgentInstance, RecoveryEvent, WorkflowRun
from provisioning.workflows.onboarding import tenant_onboard
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create
from usage.models import UsageDay

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
HOST_A, HOST_B = "biz-a.localhost", "biz-b.localhost"
ACTIONS = ("suspend", "resume", "restart", "deprovision")


@pytest.fixture(autouse=True)
def _fast_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def op_a(db):
    return operator_create(slug="biz-a", name="Alpha Business", actor=SYSTEM, domains=[HOST_A])


@pytest.fixture
def op_b(db):
    return operator_create(slug="biz-b", name="Beta Business", actor=SYSTEM, domains=[HOST_B])


def _member(operator, username: str, role: str, email: str = "") -> User:
    user = User.objects.create_user(username, email=email or f"{username}@example.com", password=PASSWORD)
    OperatorMembership.objects.create(user=user, operator=operator, role=role)
    return user


def _client(user: User | None, host: str, **kwargs) -> Client:
    client = Client(HTTP_HOST=host, **kwargs)
    if user is not None:
        client.force_login(user)
    return client


def _ready_customer(operator, slug: str) -> Tenant:
    """A customer as after a finished onboarding: ready, with a running instance."""
    tenant, _ = tenant_onboard(operator=operator, slug=slug, name=slug.replace("-", " ").title(),
                               actor=SYSTEM, allow_no_release=True)
    Tenant.objects.filter(pk=tenant.pk).update(status="ready")
    AgentInstance.objects.update_or_create(tenant=tenant, defaults={"status": InstanceStatus.RUNNING})
    tenant.refresh_from_db()
    return tenant


@pytest.fixture
def alice(op_a) -> User:
    return _member(op_a, "alice", "admin")


@pytest.fixture
def mia(op_a) -> User:
    return _member(op_a, "mia", "member")


@pytest.fixture
def vic(op_a) -> User:
    return _member(op_a, "vic", "viewer")


@pytest.fixture
def bob(op_b) -> User:
    return _member(op_b, "bob", "admin")


@pytest.fixture
def a_cust(op_a) -> Tenant:
    return _ready_customer(op_a, "alpha-shop")


@pytest.fixture
def b_cust(op_b) -> Tenant:
    return _ready_customer(op_b, "beta-shop")


def _status(tenant: Tenant) -> str:
    return Tenant.objects.get(pk=tenant.pk).status


def _messages(resp) -> str:
    return " ".join(str(m) for m in resp.wsgi_request._messages) if hasattr(resp.wsgi_request, "_messages") else ""


# --- customer actions -------------------------------------------------------------------------------------


def test_suspend_then_resume_confirm_first_and_queue_the_instance_work(op_a, alice, a_cust,
                                                                      django_capture_on_commit_callbacks):
    client = _client(alice, HOST_A)
    page = client.get(f"/customers/{a_cust.pk}/").content.decode()
    for action in ("suspend", "restart", "deprovision"):
        assert f"/customers/{a_cust.pk}/actions/{action}/" in page
    assert "/actions/resume/" not in page  # not offered while ready

    confirm = client.get(f"/customers/{a_cust.pk}/actions/suspend/")
    body = confirm.content.decode()
    assert confirm.status_code == 200 and "Suspend Alpha Shop?" in body and 'name="csrfmiddlewaretoken"' in body
    assert _status(a_cust) == "ready"  # a GET never acts

    with django_capture_on_commit_callbacks(execute=False) as queued:
        resp = client.post(f"/customers/{a_cust.pk}/actions/suspend/", {"reason": "invoice overdue"}, follow=True)
    assert resp.status_code == 200 and "is suspended" in resp.content.decode()
    assert _status(a_cust) == "suspended" and len(queued) == 1  # the stop goes to a worker, after commit
    assert AgentInstance.objects.get(tenant=a_cust).status == InstanceStatus.STOPPED
    audit = AuditLog.objects.filter(tenant=a_cust, action="tenant.transition").order_by("-id").first()
    assert audit is not None and audit.actor_label == "alice via biz-a portal" and audit.actor_id == str(alice.pk)

    page = client.get(f"/customers/{a_cust.pk}/").content.decode()
    assert "/actions/resume/" in page and "/actions/suspend/" not in page and "/actions/restart/" not in page
    with django_capture_on_commit_callbacks(execute=False) as queued:
        resp = client.post(f"/customers/{a_cust.pk}/actions/resume/", follow=True)
    assert "is resuming" in resp.content.decode() and _status(a_cust) == "ready" and len(queued) == 1


def test_actions_need_the_csrf_token(op_a, alice, a_cust):
    client = _client(alice, HOST_A, enforce_csrf_checks=True)
    for action in ACTIONS:
        assert client.post(f"/customers/{a_cust.pk}/actions/{action}/",
                           {"confirm_slug": a_cust.slug}).status_code == 403
    assert _status(a_cust) == "ready"


def test_deprovision_refuses_unless_the_slug_is_typed(op_a, alice, a_cust):
    client = _client(alice, HOST_A)
    confirm = client.get(f"/customers/{a_cust.pk}/actions/deprovision/").content.decode()
    assert "Type alpha-shop exactly" in confirm and "cannot be undone" in confirm
    for typed in ("", "alpha", "Alpha-Shop", "beta-shop", "alpha-shop-x"):
        resp = client.post(f"/customers/{a_cust.pk}/actions/deprovision/", {"confirm_slug": typed})
        assert resp.status_code == 400, typed
        assert _status(a_cust) == "ready"
    assert "nothing was deprovisioned" in resp.content.decode()
    assert not WorkflowRun.objects.filter(tenant=a_cust, kind=WorkflowKind.DEPROVISION).exists()

    resp = client.post(f"/customers/{a_cust.pk}/actions/deprovision/", {"confirm_slug": "alpha-shop"}, follow=True)
    assert resp.status_code == 200 and "Deprovisioning Alpha Shop" in resp.content.decode()
    assert _status(a_cust) == "deprovisioning"
    assert WorkflowRun.objects.filter(tenant=a_cust, kind=WorkflowKind.DEPROVISION).count() == 1


def test_restart_is_queued_and_refused_when_the_customer_is_not_running(op_a, mia, a_cust,
                                                                       django_capture_on_commit_callbacks):
    client = _client(mia, HOST_A)  # members may restart
    with django_capture_on_commit_callbacks(execute=False) as queued:
        resp = client.post(f"/customers/{a_cust.pk}/actions/restart/")
    assert resp.status_code == 302 and resp["Location"] == f"/customers/{a_cust.pk}/"
    assert len(queued) == 1
    assert AuditLog.objects.filter(tenant=a_cust, action="instance.restart_requested",
                                   actor_label="mia via biz-a portal").count() == 1
    Tenant.objects.filter(pk=a_cust.pk).update(status="suspended")
    with django_capture_on_commit_callbacks(execute=False) as queued:
        resp = client.post(f"/customers/{a_cust.pk}/actions/restart/", follow=True)
    assert "not done" in resp.content.decode() and "cannot be restarted" in resp.content.decode()
    assert queued == []


def test_viewers_see_but_cannot_act_and_members_cannot_deprovision(op_a, vic, mia, a_cust):
    viewer = _client(vic, HOST_A)
    page = viewer.get(f"/customers/{a_cust.pk}/")
    body = page.content.decode()
    assert page.status_code == 200 and "read-only access" in body and "/actions/" not in body
    assert "Save credential" not in body
    for action in ACTIONS:
        assert viewer.get(f"/customers/{a_cust.pk}/actions/{action}/").status_code == 403
        assert viewer.post(f"/customers/{a_cust.pk}/actions/{action}/",
                           {"confirm_slug": a_cust.slug}).status_code == 403
    assert viewer.post("/customers/", {"slug": "by-viewer", "name": "V", "idempotency_key": "k"}).status_code == 403
    assert viewer.post(f"/customers/{a_cust.pk}/credentials/", {"name": "x", "value": "y"}).status_code == 403
    assert not Tenant.objects.filter(slug="by-viewer").exists()

    member = _client(mia, HOST_A)
    assert "/actions/deprovision/" not in member.get(f"/customers/{a_cust.pk}/").content.decode()
    assert member.post(f"/customers/{a_cust.pk}/actions/deprovision/",
                       {"confirm_slug": a_cust.slug}).status_code == 403
    assert _status(a_cust) == "ready"


def test_every_action_on_another_operators_customer_is_404(op_a, op_b, alice, bob, a_cust, b_cust):
    Tenant.objects.filter(pk=b_cust.pk).update(status="suspended")  # so resume would be legal too
    attempts = [
        (_client(alice, HOST_A), b_cust),  # A's admin, on A's host, with B's customer id
        (_client(bob, HOST_B), a_cust),  # B's admin on its own host, with A's customer id
        (_client(bob, HOST_A), a_cust),  # B's admin's session presented on A's host
    ]
    for client, target in attempts:
        for action in (*ACTIONS, "no-such-action"):
            url = f"/customers/{target.pk}/actions/{action}/"
            assert client.get(url).status_code == 404, url
            assert client.post(url, {"confirm_slug": target.slug, "reason": "x"}).status_code == 404, url
    assert _status(a_cust) == "ready" and _status(b_cust) == "suspended"
    assert not WorkflowRun.objects.filter(kind=WorkflowKind.DEPROVISION).exists()
    assert _client(alice, HOST_A).get(f"/customers/{uuid.uuid4()}/actions/suspend/").status_code == 404


def test_the_live_part_polls_fast_while_a_worker_starts_or_stops_the_instance(op_a, alice, a_cust):
    client = _client(alice, HOST_A)

    def poll() -> str:
        found = re.search(r'hx-trigger="every (\d+)s"', client.get(f"/customers/{a_cust.pk}/live").content.decode())
        assert found
        return found.group(1)

    assert poll() == "10"  # ready and running: settled
    AgentInstance.objects.filter(tenant=a_cust).update(status=InstanceStatus.STOPPED)  # a restart under way
    assert poll() == "2"
    Tenant.objects.filter(pk=a_cust.pk).update(status="suspended")  # stopped because suspended: settled
    assert poll() == "10"
    AgentInstance.objects.filter(tenant=a_cust).update(status=InstanceStatus.STARTING)  # resuming
    assert poll() == "2"


# --- recovery history and usage ---------------------------------------------------------------------------


def test_customer_page_shows_recovery_history_and_usage_of_that_customer_only(op_a, op_b, alice, a_cust, b_cust):
    now = timezone.now()
    a_inst, b_inst = AgentInstance.objects.get(tenant=a_cust), AgentInstance.objects.get(tenant=b_cust)
    RecoveryEvent.objects.create(tenant=a_cust, instance=a_inst, reason=RecoveryReason.DEAD,
                                 detail="pid 4242 gone from /var/lib/cp/volumes/secret-path",
                                 detected_at=now - timedelta(minutes=5), resumed_at=now - timedelta(minutes=5)
                                 + timedelta(seconds=3.5), from_checkpoint="ckpt-17", steps_lost=1,
                                 outcome=RecoveryOutcome.SUCCEEDED)
    RecoveryEvent.objects.create(tenant=a_cust, instance=a_inst, reason=RecoveryReason.HUNG,
                                 detected_at=now - timedelta(days=40), outcome=RecoveryOutcome.QUARANTINED)
    RecoveryEvent.objects.create(tenant=b_cust, instance=b_inst, reason=RecoveryReason.DRIFT,
                                 detected_at=now, outcome=RecoveryOutcome.FAILED)
    for i in range(3):
        InboxItem.objects.create(tenant=a_cust, kind=InboxKind.MESSAGE, thread="main", payload={"content": "hi"},
                                 status=InboxStatus.DELIVERED if i else InboxStatus.PENDING)
    InboxItem.objects.create(tenant=a_cust, kind=InboxKind.TASK, payload={})
    for _ in range(7):
        InboxItem.objects.create(tenant=b_cust, kind=InboxKind.MESSAGE, thread="main", payload={})
    # The card's counts are the usage app's rows (what the instance recorded), not the inbox's: the two messages
    # delivered and the one task the inbox holds are not what it shows. Rows of last month are not this month's.
    today = now.date()
    UsageDay.objects.create(tenant=a_cust, day=today, messages_in=2, messages_out=2, tasks_submitted=4,
                            tasks_done=3, tasks_failed=1, steps_run=9, compute_s=12.5, effects_committed=1,
                            input_tokens=120, output_tokens=30, schema_bytes=2 * 1024 * 1024, collected_at=now)
    UsageDay.objects.create(tenant=a_cust, day=today.replace(day=1) - timedelta(days=1), messages_in=50,
                            tasks_submitted=50, collected_at=now)
    UsageDay.objects.create(tenant=b_cust, day=today, messages_in=7, tasks_submitted=70, collected_at=now)

    body = _client(alice, HOST_A).get(f"/customers/{a_cust.pk}/").content.decode()
    recoveries = body[body.index('data-testid="recoveries"'):]
    recoveries = recoveries[:recoveries.index("</table>")]
    assert "The agent stopped unexpectedly" in recoveries and "3.5 s" in recoveries and "ckpt-17" in recoveries
    assert "1 step redone" in recoveries and "The agent stopped making progress" in recoveries
    assert "paused for support" in recoveries
    assert "A resource was missing" not in body  # B's recovery
    assert "secret-path" not in body and "4242" not in body  # internal detail text is not shown
    assert re.search(r'data-testid="usage-messages">2 <span[^>]*>\(and 1 waiting for delivery\)', body)
    assert 'data-testid="usage-replies">2<' in body
    assert re.search(r'data-testid="usage-tasks">4 <span[^>]*>\(3 done, 1 failed\)', body)
    assert re.search(r'data-testid="usage-steps">9 <span[^>]*>\(12.5 s of compute\)', body)
    assert 'data-testid="usage-effects">1<' in body and 'data-testid="usage-tokens">120 in, 30 out<' in body
    assert 'data-testid="usage-schema-bytes">2.0\xa0MB<' in body
    assert re.search(r'data-testid="usage-recoveries">2 <span[^>]*>\(1 in the last 30 days\)', body)
    assert "as of" in body  # says how fresh the figures are


def test_a_customer_without_recoveries_says_so(op_a, alice, a_cust):
    body = _client(alice, HOST_A).get(f"/customers/{a_cust.pk}/").content.decode()
    assert 'data-testid="no-recoveries"' in body and 'data-testid="usage-messages">0' in body
    assert "not collected yet" in body


# --- team invitations -------------------------------------------------------------------------------------


def _invite(client: Client, email: str, role: str = "member"):
    return client.post("/team/", {"email": email, "role": role}, follow=True)


def _link_in(message) -> str:
    found = re.search(r"https?://\S+/invitations/\S+/", message.body)
    assert found, message.body
    return found.group(0)


def test_invitation_by_email_creates_the_account_and_membership(op_a, alice, caplog):
    client = _client(alice, HOST_A)
    resp = _invite(client, "New.Person@Example.COM", "viewer")
    assert resp.status_code == 200 and "Invitation mailed to New.Person@example.com" in resp.content.decode()
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["New.Person@example.com"] and "Alpha Business" in message.subject
    link = _link_in(message)
    assert link.startswith(f"http://{HOST_A}/invitations/")
    token = link.rstrip("/").rsplit("/", 1)[-1]
    invitation = OperatorInvitation.objects.get(operator=op_a)
    assert invitation.token_hash == hashlib.sha256(token.encode()).hexdigest() and token not in invitation.token_hash
    team_page = client.get("/team/").content.decode()
    assert "New.Person@example.com" in team_page and token not in team_page and token not in resp.content.decode()
    assert not any(token in str(row.data) for row in AuditLog.objects.all())

    guest = Client(HTTP_HOST=HOST_A)
    path = link.replace(f"http://{HOST_A}", "")
    form = guest.get(path, follow=True)
    # Like Django's reset links: the token leaves the URL at once (into the session), so the form's page and
    # every logged 4xx below carry a placeholder.
    assert form.redirect_chain == [("/invitations/accept/", 302)]
    assert form.status_code == 200 and "Create account and join" in form.content.decode()
    assert "no-store" in form["Cache-Control"]
    with caplog.at_level("WARNING", logger="django.request"):
        short = guest.post("/invitations/accept/", {"username": "newbie", "password1": "short", "password2": "short"})
        assert short.status_code == 400 and "too short" in short.content.decode()
        differ = guest.post("/invitations/accept/", {"username": "newbie", "password1": PASSWORD,
                                                     "password2": PASSWORD + "x"})
        assert differ.status_code == 400 and "differ" in differ.content.decode()
        taken = guest.post("/invitations/accept/", {"username": "Alice", "password1": PASSWORD, "password2": PASSWORD})
        assert taken.status_code == 400 and "taken" in taken.content.decode()
    assert "Bad Request: /invitations/accept/" in caplog.text and token not in caplog.text
    done = guest.post("/invitations/accept/", {"username": "newbie", "password1": PASSWORD, "password2": PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/"
    user = User.objects.get(username="newbie")
    assert user.email == "New.Person@example.com" and user.check_password(PASSWORD)
    assert OperatorMembership.objects.get(user=user).role == "viewer"
    assert guest.get("/").status_code == 200  # signed in on A's host

    reused = Client(HTTP_HOST=HOST_A).post(path, {"username": "again", "password1": PASSWORD, "password2": PASSWORD})
    assert reused.status_code == 410 and "already been used" in reused.content.decode()
    assert not User.objects.filter(username="again").exists()
    assert Client(HTTP_HOST=HOST_A).get(path).status_code == 410
    assert guest.get("/invitations/accept/").status_code == 410  # the session no longer holds it


def test_expired_forged_replaced_and_foreign_invitation_links_are_refused(op_a, op_b, alice, bob):
    a, b = _client(alice, HOST_A), _client(bob, HOST_B)
    _invite(a, "late@example.com")
    late = _link_in(mail.outbox[-1]).replace(f"http://{HOST_A}", "")
    OperatorInvitation.objects.filter(email="late@example.com").update(expires_at=timezone.now() - timedelta(seconds=1))
    team = a.get("/team/").content.decode()
    late_row = team[team.index("late@example.com"):]
    assert "expired" in late_row[:late_row.index("</tr>")]
    _invite(a, "twice@example.com")
    first = _link_in(mail.outbox[-1]).replace(f"http://{HOST_A}", "")
    _invite(a, "twice@example.com")  # replaces the first link
    second = _link_in(mail.outbox[-1]).replace(f"http://{HOST_A}", "")
    team = a.get("/team/").content.decode()
    assert team.count("twice@example.com") == 2  # one pending row (and its withdraw link's label)
    twice_row = team[team.index("twice@example.com"):]
    assert "expired" not in twice_row[:twice_row.index("</tr>")]
    _invite(b, "beta-hire@example.com")
    foreign = _link_in(mail.outbox[-1]).replace(f"http://{HOST_B}", "")

    cases = {late: "expired", first: "withdrawn or replaced", "/invitations/" + "A" * 43 + "/": "not valid",
             foreign: "not valid"}
    for path, words in cases.items():
        for resp in (Client(HTTP_HOST=HOST_A).get(path),
                     Client(HTTP_HOST=HOST_A).post(path, {"username": "x1", "password1": PASSWORD,
                                                          "password2": PASSWORD})):
            assert resp.status_code == 410, path
            assert words in resp.content.decode(), (path, words)
    assert not User.objects.filter(username="x1").exists()
    assert Client(HTTP_HOST=HOST_A).get(second, follow=True).status_code == 200
    assert Client(HTTP_HOST=HOST_B).get(foreign, follow=True).status_code == 200  # on its own host it works
    assert Client(HTTP_HOST=HOST_A).get("/invitations/accept/").status_code == 410  # no token in this session


def test_an_existing_account_is_attached_after_signing_in(op_a, op_b, alice, bob):
    _invite(_client(alice, HOST_A), bob.email, "admin")
    path = _link_in(mail.outbox[-1]).replace(f"http://{HOST_A}", "")
    guest = Client(HTTP_HOST=HOST_A)
    page = guest.get(path, follow=True).content.decode()
    assert "Sign in and join" in page and "An account already exists" in page
    form = "/invitations/accept/"
    wrong = guest.post(form, {"username": "bob", "password": "not it"})
    assert wrong.status_code == 400 and "do not match" in wrong.content.decode()
    assert not OperatorMembership.objects.filter(user=bob, operator=op_a).exists()
    other = guest.post(form, {"username": "alice", "password": PASSWORD})  # a real account, not the invited one
    assert other.status_code == 400 and "not registered under the invited address" in other.content.decode()
    ok = guest.post(form, {"username": "bob", "password": PASSWORD})
    assert ok.status_code == 302
    assert OperatorMembership.objects.get(user=bob, operator=op_a).role == "admin"
    assert OperatorMembership.objects.get(user=bob, operator=op_b).role == "admin"  # B's membership untouched
    assert User.objects.filter(email=bob.email).count() == 1


def test_team_page_is_for_admins_of_the_host_operator(op_a, op_b, alice, mia, vic, bob):
    assert _client(mia, HOST_A).get("/team/").status_code == 403
    assert _client(vic, HOST_A).post("/team/", {"email": "x@example.com", "role": "admin"}).status_code == 403
    assert _client(bob, HOST_A).get("/team/").status_code == 404
    already = _invite(_client(alice, HOST_A), "MIA@example.com")
    assert "already in the team" in already.content.decode()
    _invite(_client(bob, HOST_B), "b-only@example.com")
    invitation = OperatorInvitation.objects.get(email="b-only@example.com")
    assert _client(alice, HOST_A).post(f"/team/invitations/{invitation.pk}/withdraw/").status_code == 404
    membership = OperatorMembership.objects.get(user=bob)
    assert _client(alice, HOST_A).post(f"/team/members/{membership.pk}/remove/").status_code == 404
    assert OperatorMembership.objects.filter(user=bob).exists() and invitation.revoked_at is None
    assert len(mail.outbox) == 1  # refused invitations send nothing


def test_withdrawing_and_removing(op_a, alice, mia):
    client = _client(alice, HOST_A)
    _invite(client, "maybe@example.com")
    path = _link_in(mail.outbox[-1]).replace(f"http://{HOST_A}", "")
    invitation = OperatorInvitation.objects.get(email="maybe@example.com")
    assert "Withdraw the invitation" in client.get(f"/team/invitations/{invitation.pk}/withdraw/").content.decode()
    client.post(f"/team/invitations/{invitation.pk}/withdraw/")
    assert Client(HTTP_HOST=HOST_A).get(path).status_code == 410
    membership = OperatorMembership.objects.get(user=mia)
    client.post(f"/team/members/{membership.pk}/remove/")
    assert not OperatorMembership.objects.filter(user=mia).exists() and User.objects.filter(pk=mia.pk).exists()
    only_admin = OperatorMembership.objects.get(user=alice)
    resp = client.post(f"/team/members/{only_admin.pk}/remove/", follow=True)
    assert "only admin" in resp.content.decode() and OperatorMembership.objects.filter(user=alice).exists()


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], str]] = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content.decode()))
        return "250 OK"


def test_invitation_goes_through_the_configured_smtp_backend(op_a, alice, settings):
    inbox = _Inbox()
    smtp = Controller(inbox, hostname="127.0.0.1", port=free_port())
    smtp.start()
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", smtp.port
        settings.DEFAULT_FROM_EMAIL = "portal@alpha.example"
        resp = _invite(_client(alice, HOST_A), "smtp-person@example.com")
    finally:
        smtp.stop()
    assert "Invitation mailed" in resp.content.decode()
    assert len(inbox.messages) == 1
    sender, recipients, content = inbox.messages[0]
    assert sender == "portal@alpha.example" and recipients == ["smtp-person@example.com"]
    assert f"http://{HOST_A}/invitations/" in content


def test_a_mail_server_that_is_down_gives_a_clear_error_and_no_live_invitation(op_a, alice, settings, caplog):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", free_port(), 2
    resp = _invite(_client(alice, HOST_A), "nobody-gets-it@example.com")
    body = resp.content.decode()
    assert resp.status_code == 400 and "could not be mailed" in body and "EMAIL_URL" in body
    invitation = OperatorInvitation.objects.get(email="nobody-gets-it@example.com")
    assert invitation.revoked_at is not None  # not left "pending" for a mail nobody got
    assert "/invitations/" not in caplog.text


# --- password reset ---------------------------------------------------------------------------------------


def _reset_link(message, host: str) -> str:
    found = re.search(rf"http://{re.escape(host)}(/password-reset/[^/\s]+/[^/\s]+/)", message.body)
    assert found, message.body
    return found.group(1)


def test_password_reset_with_djangos_views_on_the_operator_host(op_a, op_b, alice, bob):
    guest = Client(HTTP_HOST=HOST_A)
    assert "Forgot your password?" in guest.get("/login/").content.decode()
    form = guest.get("/password-reset/")
    assert form.status_code == 200 and "Reset your password" in form.content.decode()
    sent = guest.post("/password-reset/", {"email": "alice@example.com"})
    assert sent.status_code == 302 and sent["Location"] == "/password-reset/sent/"
    assert "Check your mail" in guest.get("/password-reset/sent/").content.decode()
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["alice@example.com"]
    assert "Alpha Business" in mail.outbox[0].subject
    path = _reset_link(mail.outbox[0], HOST_A)

    confirm = guest.get(path, follow=True)  # Django swaps the token into the session and redirects
    assert "Choose a new password" in confirm.content.decode()
    set_url = confirm.redirect_chain[-1][0]
    done = guest.post(set_url, {"new_password1": "a brand new passphrase", "new_password2": "a brand new passphrase"})
    assert done.status_code == 302 and done["Location"] == "/password-reset/done/"
    complete = guest.get("/password-reset/done/").content.decode()
    assert "Password changed" in complete and 'href="/login/"' in complete
    alice.refresh_from_db()
    assert alice.check_password("a brand new passphrase")
    signed_in = Client(HTTP_HOST=HOST_A).post("/login/", {"username": "alice", "password": "a brand new passphrase"})
    assert signed_in.status_code == 302
    again = Client(HTTP_HOST=HOST_A).get(path, follow=True).content.decode()
    assert 'data-testid="reset-link-invalid"' in again  # used once


def test_password_reset_mails_are_limited_per_address(op_a, alice, settings):
    settings.PORTAL_PASSWORD_RESET_INTERVAL_S = 30
    guest = Client(HTTP_HOST=HOST_A)
    for _ in range(5):
        resp = guest.post("/password-reset/", {"email": "Alice@Example.com"})
        assert resp.status_code == 302 and resp["Location"] == "/password-reset/sent/"
    assert len(mail.outbox) == 1  # the first; the next four within the interval send nothing


def test_password_reset_mails_only_members_of_the_host_operator(op_a, op_b, alice, bob):
    User.objects.create_superuser("root", email="root@example.com", password=PASSWORD)
    guest = Client(HTTP_HOST=HOST_A)
    for email in ("bob@example.com", "root@example.com", "unknown@example.com"):
        resp = guest.post("/password-reset/", {"email": email})
        assert resp.status_code == 302 and resp["Location"] == "/password-reset/sent/"  # the same answer
    assert mail.outbox == []
    # Bob's own reset link (mailed on B's host) does not work on A's host.
    Client(HTTP_HOST=HOST_B).post("/password-reset/", {"email": "bob@example.com"})
    path = _reset_link(mail.outbox[-1], HOST_B)
    on_a = Client(HTTP_HOST=HOST_A).get(path, follow=True).content.decode()
    assert 'data-testid="reset-link-invalid"' in on_a
    on_b = Client(HTTP_HOST=HOST_B).get(path, follow=True).content.decode()
    assert "Choose a new password" in on_b


# --- branding edits ---------------------------------------------------------------------------------------

LOW_CONTRAST = "#d2d2d2"


def _field_value(body: str, name: str) -> str:
    found = re.search(rf'name="{name}"[^>]*value="([^"]*)"', body) or re.search(
        rf'value="([^"]*)"[^>]*name="{name}"', body)
    assert found, name
    return found.group(1)


def test_a_rejected_submission_keeps_the_edits_with_the_error(op_a, alice):
    client = _client(alice, HOST_A)
    resp = client.post("/branding/", {"product_name": "My Edited Brand", "primary_color": LOW_CONTRAST,
                                      "background_color": "#ffffff", "support_email": "edit@alpha.example",
                                      "action": "publish"})
    body = resp.content.decode()
    assert resp.status_code == 400
    assert _field_value(body, "product_name") == "My Edited Brand"
    assert _field_value(body, "primary_color") == LOW_CONTRAST
    assert _field_value(body, "support_email") == "edit@alpha.example"
    assert 'id="id_primary_color_error"' in body and "4.5:1" in body
    assert not BrandingRevision.objects.exists()

    # Rejected later by the job (as when validation only fails there): the page still opens with the edits.
    revision = branding_submit(operator=op_a, actor=SYSTEM, product_name="Job Rejects Me",
                               primary_color=LOW_CONTRAST, background_color="#ffffff")
    assert branding_revision_process(str(revision.pk)) == RevisionStatus.REJECTED
    body = client.get("/branding/").content.decode()
    assert _field_value(body, "product_name") == "Job Rejects Me"
    assert _field_value(body, "primary_color") == LOW_CONTRAST
    assert 'id="id_primary_color_error"' in body and "Not published" in body


def test_after_publishing_the_form_shows_the_published_values(op_a, alice):
    client = _client(alice, HOST_A)
    resp = client.post("/branding/", {"product_name": "Alpha <b>Cloud</b>", "primary_color": "#7a1f5c",
                                      "background_color": "#ffffff", "action": "publish"})
    assert resp.status_code == 302
    revision = BrandingRevision.objects.get(operator=op_a)
    pending = client.get("/branding/").content.decode()
    assert _field_value(pending, "primary_color") == "#7a1f5c"  # the submission, not the old theme
    assert f"?pending={revision.pk}" in pending
    still = client.get(f"/branding/status?pending={revision.pk}")
    assert "HX-Refresh" not in still  # nothing decided yet: keep polling, no reload

    assert branding_revision_process(str(revision.pk)) == RevisionStatus.PUBLISHED
    decided = client.get(f"/branding/status?pending={revision.pk}")
    assert decided["HX-Refresh"] == "true"  # the page reloads itself once the job has decided
    assert "HX-Refresh" not in client.get("/branding/status")
    body = client.get("/branding/").content.decode()
    assert _field_value(body, "product_name") == "Alpha Cloud"  # the published (cleaned) value
    assert _field_value(body, "primary_color") == "#7a1f5c" and "?pending=" not in body


def test_the_customer_page_lists_its_mcp_servers_without_a_token(op_a, alice, a_cust) -> None:  # type: ignore[no-untyped-def]
    from mcp_servers.models import McpServer

    McpServer.objects.create(operator=op_a, tenant=None, name="docs", url="https://docs.example/mcp")
    McpServer.objects.create(operator=op_a, tenant=a_cust, name="crm", url="https://crm.example/mcp",
                             credential="crm-token", allowed_tools=["lookup"])
    page = _client(alice, HOST_A).get(f"/customers/{a_cust.pk}/").content.decode()
    assert 'data-testid="mcp-servers-card"' in page
    for shown in ("https://docs.example/mcp", "https://crm.example/mcp", "crm-token", "every customer", "lookup"):
        assert shown in page


def test_a_customers_mcp_server_is_added_and_removed_from_its_page_with_errors_shown_and_audited(
        op_a, op_b, alice, vic, bob, a_cust, settings) -> None:  # type: ignore[no-untyped-def]
    from mcp_servers.models import McpServer
    from vault.services import credential_put

    settings.MCP_SERVERS_ALLOW_HTTP = False
    credential_put(tenant=a_cust, name="crm-token", value="crm-secret-never-shown", actor=SYSTEM)
    add = f"/customers/{a_cust.pk}/mcp-servers/"
    form = {"name": "crm", "url": "https://crm.example/mcp", "credential": "crm-token", "connection": "",
            "allowed_tools": "lookup_order, upsert_contact", "trust_annotations": "on"}

    # Without the CSRF token, as a viewer, or from another operator: refused, nothing stored.
    assert _client(alice, HOST_A, enforce_csrf_checks=True).post(add, form).status_code == 403
    assert _client(vic, HOST_A).post(add, form).status_code == 403
    assert _client(bob, HOST_B).post(add, form).status_code == 404
    assert "mcp-server-form" not in _client(vic, HOST_A).get(f"/customers/{a_cust.pk}/").content.decode()
    assert not McpServer.objects.exists()

    # The service's refusals come back on the form, next to their field, with the entered values kept.
    client = _client(alice, HOST_A)
    for bad, field, message in (({"url": "http://crm.example/mcp"}, "url", "https://"),
                                ({"credential": "not-in-vault"}, "credential", "holds no credential"),
                                ({"credential": "", "connection": "nobody"}, "connection", "no OAuth client"),
                                ({"name": "Bad Name!"}, "name", "name must be")):
        resp = client.post(add, {**form, **bad})
        body = resp.content.decode()
        assert resp.status_code == 400, bad
        assert f'id="id_{field}_error"' in body and message in body, (bad, body[body.find("errorlist"):][:300])
        assert not McpServer.objects.exists()

    # A good one: stored as the customer's own, audited, listed with a Remove link; the token never shown.
    resp = client.post(add, form)
    assert resp.status_code == 302, resp.content.decode()[:2000]
    row = McpServer.objects.get()
    assert (row.tenant_id, row.operator_id, row.name, row.credential, row.allowed_tools, row.trust_annotations) == (
        a_cust.pk, op_a.pk, "crm", "crm-token", ["lookup_order", "upsert_contact"], True)
    assert AuditLog.objects.filter(action="mcp_server.create", tenant=a_cust).count() == 1
    page = client.get(f"/customers/{a_cust.pk}/").content.decode()
    assert "lookup_order, upsert_contact" in page and "crm-secret-never-shown" not in page
    remove = f"/customers/{a_cust.pk}/mcp-servers/{row.pk}/remove/"
    assert remove in page
    # The same name again: a conflict on the form, not a second row.
    again = client.post(add, form)
    assert again.status_code == 400 and "already registered" in again.content.decode()

    # Removing: another operator's admin gets 404, a GET only asks, the POST removes and audits.
    assert _client(bob, HOST_B).post(remove).status_code == 404
    assert _client(vic, HOST_A).post(remove).status_code == 403
    assert "Remove MCP server crm?" in client.get(remove).content.decode()
    assert McpServer.objects.count() == 1
    assert _client(alice, HOST_A, enforce_csrf_checks=True).post(remove).status_code == 403
    assert client.post(remove).status_code == 302
    assert not McpServer.objects.exists()
    assert AuditLog.objects.filter(action="mcp_server.delete", tenant=a_cust).count() == 1
    # An operator-wide entry is listed on the page but not removable from it.
    shared = McpServer.objects.create(operator=op_a, tenant=None, name="docs", url="https://docs.example/mcp")
    assert f"/mcp-servers/{shared.pk}/remove/" not in client.get(f"/customers/{a_cust.pk}/").content.decode()
    assert client.post(f"/customers/{a_cust.pk}/mcp-servers/{shared.pk}/remove/").status_code == 404
    assert McpServer.objects.filter(pk=shared.pk).exists()
