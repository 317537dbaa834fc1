"""Issue 14 on the screens: releases, rollouts and a customer's pin in the operator portal, rollouts on the staff
dashboard. Real database, the Django test client on the operator's host; the upload runs the real validation
(pip and the sandboxed probe). Rollouts are planned for real; their Celery task is queued on commit, which a
``django_db`` test never reaches, so nothing is restarted here (tests/releases/test_release_rollouts.py runs them).
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from portal.models import OperatorMembership
from provisioning.workflows.onboarding import tenant_onboard
from releases.models import AgentRelease, DefaultRelease, ReleaseAssignment, Rollout, RolloutItem
from releases.rollouts import rollout_create
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Tenant
from tenants.services import operator_create
from tests.releases.test_releases_upload import make_wheel

pytestmark = pytest.mark.django_db

HOST_A, HOST_B = "rel-a.localhost", "rel-b.localhost"


@pytest.fixture(autouse=True)
def releases_root(tmp_path, settings):  # type: ignore[no-untyped-def]
    settings.RELEASES_ROOT = tmp_path / "releases"
    settings.RELEASE_VALIDATION_TIMEOUT_S = 60
    (Path(django_settings.VAR_DIR) / "secrets").mkdir(mode=0o700, parents=True, exist_ok=True)
    return settings.RELEASES_ROOT


@pytest.fixture
def op_a(db):  # type: ignore[no-untyped-def]
    return operator_create(slug="rel-a", name="Alpha", actor=SYSTEM, domains=[HOST_A])


@pytest.fixture
def op_b(db):  # type: ignore[no-untyped-def]
    return operator_create(slug="rel-b", name="Beta", actor=SYSTEM, domains=[HOST_B])


def _portal_client(operator, role: str, host: str) -> Client:  # type: ignore[no-untyped-def]
    user = User.objects.create_user(f"{operator.slug}-{role}", password="correct horse battery staple")
    OperatorMembership.objects.create(user=user, operator=operator, role=role)
    client = Client(HTTP_HOST=host)
    client.force_login(user)
    return client


@pytest.fixture
def admin(op_a) -> Client:  # type: ignore[no-untyped-def]
    return _portal_client(op_a, "admin", HOST_A)


@pytest.fixture
def member(op_a) -> Client:  # type: ignore[no-untyped-def]
    return _portal_client(op_a, "member", HOST_A)


def _fake_release(operator, version: str) -> AgentRelease:  # type: ignore[no-untyped-def]
    """A registered release row (the pages and the planning need no installed wheel)."""
    return AgentRelease.objects.create(operator=operator, version=version, distribution="greeter-agent",
                                       digest="sha256:" + "ab" * 32, filename="g.whl", size_bytes=1,
                                       artifact_key="x", kinds={"greeter": "says hello"}, notes=f"notes of {version}")


def _ready(operator, n: int, prefix: str = "cust") -> list[Tenant]:  # type: ignore[no-untyped-def]
    made = [tenant_onboard(operator=operator, slug=f"{prefix}-{i}", name=f"Customer {i}",
                           actor=SYSTEM, allow_no_release=True)[0]
            for i in range(n)]
    Tenant.objects.filter(pk__in=[t.pk for t in made]).update(status="ready")
    return [Tenant.objects.get(pk=t.pk) for t in made]


def _text(resp) -> str:  # type: ignore[no-untyped-def]
    return resp.content.decode()


def test_pages_render_for_a_member_with_the_release_each_customer_runs(op_a, member):
    old, new = _fake_release(op_a, "1.0.0"), _fake_release(op_a, "2.0.0")
    DefaultRelease.objects.create(operator=op_a, release=old)
    pinned, following, unassigned = _ready(op_a, 3)
    ReleaseAssignment.objects.create(tenant=pinned, release=old, pinned=True)
    ReleaseAssignment.objects.create(tenant=following, release=old)

    home = _text(member.get("/"))
    assert 'href="/releases/"' in home and 'href="/rollouts/"' in home  # the nav links, for every member
    cells = re.findall(r'data-testid="customer-release">(.*?)</td>', home, re.S)
    assert len(cells) == 3 and all("</div>" in c for c in cells)
    by_slug = dict(zip(re.findall(r'<div class="small muted">(cust-\d)</div>', home), cells, strict=True))
    assert "1.0.0" in by_slug["cust-0"] and "pinned" in by_slug["cust-0"]
    assert "1.0.0" in by_slug["cust-1"] and "follows the default" in by_slug["cust-1"]
    assert "runtime agents" in by_slug["cust-2"] and "follows the default" in by_slug["cust-2"]
    assert "No release recorded" in _text(member.get(f"/customers/{unassigned.pk}/"))
    rollout = rollout_create(operator=op_a, release_id=new.pk, actor=SYSTEM, canary=1, wave_size=1, soak_s=0)

    page = member.get("/releases/")
    assert page.status_code == 200
    body = _text(page)
    assert "2.0.0" in body and "1.0.0" in body and "notes of 2.0.0" in body and "greeter" in body
    assert 'data-testid="default-release">1.0.0<' in body and ("ab" * 6) in body  # the short digest
    assert 'action="/releases/upload/"' not in body and "Make default" not in body  # admins only
    assert 'data-testid="active-rollout"' in body

    listing = _text(member.get("/rollouts/"))
    assert f'href="/rollouts/{rollout.pk}/"' in listing and "2 pending" in listing
    detail = member.get(f"/rollouts/{rollout.pk}/")
    assert detail.status_code == 200
    text = _text(detail)
    assert 'data-testid="rollout-status">running<' in text
    assert 'data-testid="count-pending">2<' in text and text.count('data-testid="rollout-item"') == 2
    assert f'hx-get="/rollouts/{rollout.pk}/live"' in text  # polled while active
    assert 'data-testid="rollout-actions"' not in text  # members watch, admins act
    assert member.get(f"/rollouts/{rollout.pk}/live").status_code == 200

    customer = _text(member.get(f"/customers/{pinned.pk}/"))
    assert 'data-testid="release-version">1.0.0<' in customer and "pinned" in customer
    assert f'action="/customers/{pinned.pk}/release/"' not in customer  # the pin form is for admins


def test_an_admin_uploads_a_real_wheel_and_a_bad_one_registers_nothing(op_a, admin):
    filename, data = make_wheel(version="0.3.0")
    resp = admin.post("/releases/upload/", {"file": SimpleUploadedFile(filename, data), "notes": "first one"})
    assert resp.status_code == 302, _text(resp)[:2000]
    release = AgentRelease.objects.get(operator=op_a)
    assert (release.version, release.notes, list(release.kinds)) == ("0.3.0", "first one", ["hello"])
    assert AuditLog.objects.filter(action="release.create", target_id=str(release.pk)).exists()
    page = _text(admin.get("/releases/"))
    assert "Release 0.3.0 registered" in page and "first one" in page

    bad = admin.post("/releases/upload/", {"file": SimpleUploadedFile("hello_agent-0.4.0-py3-none-any.whl",
                                                                        b"this is not a wheel at all")})
    assert bad.status_code == 400
    assert "Not registered: not a wheel: the file is not a zip archive" in _text(bad)
    broken = make_wheel(version="0.5.0", module="import definitely_not_a_module\n")
    refused = admin.post("/releases/upload/", {"file": SimpleUploadedFile(*broken)})
    assert refused.status_code == 400 and "failed to import: ModuleNotFoundError" in _text(refused)
    again = admin.post("/releases/upload/", {"file": SimpleUploadedFile(filename, data)})
    assert again.status_code == 409 and "already exists" in _text(again)
    assert admin.post("/releases/upload/", {"notes": "no file"}).status_code == 400
    assert list(AgentRelease.objects.values_list("version", flat=True)) == ["0.3.0"]


def test_a_wheel_past_the_limit_is_refused_before_it_is_read(op_a, admin, settings):
    settings.RELEASE_MAX_WHEEL_BYTES = 1024
    filename, data = make_wheel(version="0.3.0", module=f"x = {secrets.token_hex(2048)!r}\n")  # incompressible
    resp = admin.post("/releases/upload/", {"file": SimpleUploadedFile(filename, data)})
    assert resp.status_code == 413 and "larger than" in _text(resp)
    assert not AgentRelease.objects.exists()


def test_members_can_neither_upload_nor_roll_out_nor_act(op_a, member):
    release = _fake_release(op_a, "1.0.0")
    (tenant,) = _ready(op_a, 1)
    rollout = rollout_create(operator=op_a, release_id=release.pk, actor=SYSTEM)
    filename, data = make_wheel(version="0.3.0")
    assert member.post("/releases/upload/", {"file": SimpleUploadedFile(filename, data)}).status_code == 403
    assert member.post(f"/releases/{release.pk}/default/").status_code == 403
    assert member.get(f"/releases/{release.pk}/rollout/").status_code == 403
    assert member.post(f"/releases/{release.pk}/rollout/", {"canary": 1}).status_code == 403
    for action in ("pause", "abort", "rollback"):
        assert member.get(f"/rollouts/{rollout.pk}/actions/{action}/").status_code == 403
        assert member.post(f"/rollouts/{rollout.pk}/actions/{action}/").status_code == 403
    assert member.post(f"/customers/{tenant.pk}/release/", {"release": str(release.pk)}).status_code == 403
    assert list(AgentRelease.objects.values_list("version", flat=True)) == ["1.0.0"]
    assert not DefaultRelease.objects.exists() and Rollout.objects.get().status == "running"
    assert Rollout.objects.count() == 1 and not ReleaseAssignment.objects.filter(pinned=True).exists()


def test_the_rollout_form_shows_the_defaults_and_creates_a_rollout(op_a, admin, settings):
    settings.RELEASE_ROLLOUT_WAVE_SIZE, settings.RELEASE_ROLLOUT_SOAK_S = 7, 45
    release = _fake_release(op_a, "2.0.0")
    _ready(op_a, 5)
    form = _text(admin.get(f"/releases/{release.pk}/rollout/"))
    assert 'name="wave_size" value="7"' in form and 'name="soak_s" value="45"' in form
    assert f"empty for {settings.RELEASE_ROLLOUT_CANARY}" in form

    bad = admin.post(f"/releases/{release.pk}/rollout/", {"canary": "1", "wave_size": "0", "soak_s": "5"})
    assert bad.status_code == 400 and "wave_size must be between 1 and" in _text(bad)
    both = admin.post(f"/releases/{release.pk}/rollout/", {"canary": "1", "canary_percent": "20"})
    assert both.status_code == 400 and "give canary or canary_percent, not both" in _text(both)
    assert admin.post(f"/releases/{release.pk}/rollout/", {"wave_size": "many"}).status_code == 400
    assert not Rollout.objects.exists()

    resp = admin.post(f"/releases/{release.pk}/rollout/", {"canary": "2", "wave_size": "2", "soak_s": "5"})
    rollout = Rollout.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/rollouts/{rollout.pk}/"
    assert (rollout.release, rollout.canary, rollout.wave_size, rollout.soak_s) == (release, 2, 2, 5)
    assert sorted(RolloutItem.objects.filter(rollout=rollout).values_list("wave", flat=True)) == [0, 0, 1, 1, 2]
    assert "5 customers to move" in _text(admin.get(resp["Location"]))

    conflict = admin.post(f"/releases/{release.pk}/rollout/", {})
    assert conflict.status_code == 409 and "another rollout of yours is active" in _text(conflict)
    assert Rollout.objects.count() == 1


def test_pause_resume_abort_and_rollback_buttons_follow_the_status(op_a, admin):
    release = _fake_release(op_a, "2.0.0")
    _ready(op_a, 2)
    rollout = rollout_create(operator=op_a, release_id=release.pk, actor=SYSTEM)
    base = f"/rollouts/{rollout.pk}"

    def buttons() -> str:
        text = _text(admin.get(f"{base}/"))
        return text.split('data-testid="rollout-actions"', 1)[1].split("</div>", 1)[0] if (
            'data-testid="rollout-actions"' in text) else ""

    assert f"{base}/actions/pause/" in buttons() and f"{base}/actions/abort/" in buttons()
    assert f"{base}/actions/resume/" not in buttons()
    assert admin.post(f"{base}/actions/pause/").status_code == 302
    rollout.refresh_from_db()
    assert rollout.status == "paused" and "paused by" in rollout.reason
    assert f"{base}/actions/resume/" in buttons() and f"{base}/actions/pause/" not in buttons()
    assert admin.post(f"{base}/actions/resume/").status_code == 302
    rollout.refresh_from_db()
    assert rollout.status == "running"

    confirm = admin.get(f"{base}/actions/abort/")
    assert confirm.status_code == 200 and "Yes, abort" in _text(confirm)
    rollout.refresh_from_db()
    assert rollout.status == "running"  # the confirmation page changes nothing
    assert admin.post(f"{base}/actions/abort/").status_code == 302
    rollout.refresh_from_db()
    assert rollout.status == "aborted" and rollout.finished_at is not None
    page = _text(admin.get(f"{base}/"))
    assert "Rollout aborted" in page and 'data-testid="rollout-status">aborted<' in page
    assert "hx-get=" not in page.split('id="rollout-live"', 1)[1].split(">", 1)[0]  # finished: no more polling
    assert f"{base}/actions/abort/" not in buttons() and f"{base}/actions/rollback/" in buttons()

    refused = admin.post(f"{base}/actions/resume/", follow=True)
    assert "not done. a aborted rollout cannot be resumed" in _text(refused)
    assert admin.post(f"{base}/actions/explode/").status_code == 404
    # A later rollout makes rolling this one back meaningless: the button goes, the service still refuses.
    rollout_create(operator=op_a, release_id=_fake_release(op_a, "3.0.0").pk, actor=SYSTEM)
    assert f"{base}/actions/rollback/" not in buttons()
    assert "a later rollout has started" in _text(admin.post(f"{base}/actions/rollback/", follow=True))
    rollout.refresh_from_db()
    assert rollout.status == "aborted"


def test_make_default_and_pin_and_unpin_a_customer(op_a, admin):
    old, new = _fake_release(op_a, "1.0.0"), _fake_release(op_a, "2.0.0")
    assert admin.post(f"/releases/{old.pk}/default/").status_code == 302
    assert DefaultRelease.objects.get(operator=op_a).release == old
    assert "New customers now start on 1.0.0" in _text(admin.get("/releases/"))
    (tenant,) = _ready(op_a, 1)
    page = _text(admin.get(f"/customers/{tenant.pk}/"))
    assert f'action="/customers/{tenant.pk}/release/"' in page and "Pin to 2.0.0" in page

    resp = admin.post(f"/customers/{tenant.pk}/release/", {"release": str(new.pk)}, follow=True)
    assignment = ReleaseAssignment.objects.get(tenant=tenant)
    assert (assignment.release, assignment.pinned) == (new, True)
    assert "pinned to 2.0.0. Its agent is restarting on it" in _text(resp)
    assert AuditLog.objects.filter(action="instance.restart_requested", tenant=tenant).count() == 1
    assert 'data-testid="release-version">2.0.0<' in _text(resp)

    unpinned = admin.post(f"/customers/{tenant.pk}/release/", {"release": ""}, follow=True)
    assignment.refresh_from_db()
    assert (assignment.release, assignment.pinned) == (old, False)
    assert "follows your default (1.0.0)" in _text(unpinned)

    # While a rollout moves the customer, its release is the rollout's to change.
    rollout_create(operator=op_a, release_id=new.pk, actor=SYSTEM)
    refused = admin.post(f"/customers/{tenant.pk}/release/", {"release": str(new.pk)}, follow=True)
    assert "not changed. a rollout is moving this tenant" in _text(refused)
    assignment.refresh_from_db()
    assert not assignment.pinned


def test_another_operators_releases_and_rollouts_are_404_on_this_portal(op_a, op_b, admin):
    theirs = _fake_release(op_b, "9.9.9")
    (their_customer,) = _ready(op_b, 1, prefix="beta")
    their_rollout = rollout_create(operator=op_b, release_id=theirs.pk, actor=SYSTEM)
    (mine,) = _ready(op_a, 1)
    for path in (f"/rollouts/{their_rollout.pk}/", f"/rollouts/{their_rollout.pk}/live",
                 f"/rollouts/{their_rollout.pk}/actions/abort/", f"/releases/{theirs.pk}/rollout/"):
        assert admin.get(path).status_code == 404, path
    for path in (f"/rollouts/{their_rollout.pk}/actions/pause/", f"/releases/{theirs.pk}/default/",
                 f"/releases/{theirs.pk}/rollout/", f"/customers/{their_customer.pk}/release/"):
        assert admin.post(path).status_code == 404, path
    # Naming their release for my own customer is a 404 too.
    assert admin.post(f"/customers/{mine.pk}/release/", {"release": str(theirs.pk)}).status_code == 404
    assert "9.9.9" not in _text(admin.get("/releases/")) + _text(admin.get("/rollouts/"))
    their_rollout.refresh_from_db()
    assert their_rollout.status == "running" and not DefaultRelease.objects.exists()
    assert not ReleaseAssignment.objects.filter(release=theirs).exists()


def test_the_dashboard_lists_every_operators_rollouts_to_staff_only(op_a, op_b):
    releases = {op: _fake_release(op, version) for op, version in ((op_a, "1.2.3"), (op_b, "4.5.6"))}
    _ready(op_a, 2)
    _ready(op_b, 1, prefix="beta")
    made = {op.slug: rollout_create(operator=op, release_id=r.pk, actor=SYSTEM) for op, r in releases.items()}
    staff = User.objects.create_user("rel-staff", password="x", is_staff=True)
    client = Client()
    client.force_login(staff)
    listing = client.get("/dashboard/rollouts/")
    assert listing.status_code == 200
    body = _text(listing)
    assert body.count('data-testid="rollout-row"') == 2
    assert "rel-a" in body and "rel-b" in body and "1.2.3" in body and "4.5.6" in body
    assert "2 pending" in body and "1 pending" in body and 'href="/dashboard/rollouts/"' in body  # the nav link
    only_b = _text(client.get("/dashboard/rollouts/?operator=rel-b"))
    assert "4.5.6" in only_b and "1.2.3" not in only_b
    detail = _text(client.get(f"/dashboard/rollouts/{made['rel-a'].pk}/"))
    assert detail.count('data-testid="rollout-item"') == 2 and "cust-0" in detail and "/dashboard/tenants/" in detail
    assert client.get(f"/dashboard/rollouts/{made['rel-b'].pk}/live").status_code == 200
    tenants = _text(client.get("/dashboard/tenants/"))
    assert tenants.count('data-testid="tenant-release"') == 3 and "runtime agents" in tenants

    outsider = User.objects.create_user("rel-not-staff", password="x")
    OperatorMembership.objects.create(user=outsider, operator=op_a, role="admin")
    other = Client()
    other.force_login(outsider)
    assert other.get("/dashboard/rollouts/").status_code == 403
    assert other.get(f"/dashboard/rollouts/{made['rel-a'].pk}/").status_code == 403
    anonymous = Client().get("/dashboard/rollouts/")
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]


def test_uploads_and_rollout_actions_without_the_csrf_token_are_refused(op_a):
    """The upload view is csrf_exempt only until its size-limiting handler is in place; CSRF is then enforced."""
    user = User.objects.create_user("rel-a-csrf", password="correct horse battery staple")
    OperatorMembership.objects.create(user=user, operator=op_a, role="admin")
    client = Client(enforce_csrf_checks=True, HTTP_HOST=HOST_A)
    client.force_login(user)
    filename, data = make_wheel(version="0.9.0")
    assert client.post("/releases/upload/", {"file": SimpleUploadedFile(filename, data)}).status_code == 403
    release = _fake_release(op_a, "1.0.0")
    assert client.post(f"/releases/{release.pk}/default/").status_code == 403
    assert client.post(f"/releases/{release.pk}/rollout/", {"wave_size": 5}).status_code == 403
    assert not AgentRelease.objects.filter(version="0.9.0").exists()
    assert not DefaultRelease.objects.exists() and not Rollout.objects.exists()
