"""Issue 17 (demo and run): the demo's operator portal is reachable, someone can sign in, and the demo says so.

The demo's own functions run here as ``make demo`` runs them: ``manage.py`` subprocesses against this
session's test database, its secrets under a scratch var directory. The printed portal URL is then fetched
through the whole middleware stack (Django's test client with that Host header).
"""

from __future__ import annotations

import importlib.util
import re
import stat
import sys
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.models import AuditLog, Operator
from tenants.services import operator_create

from .conftest import BASE_DIR, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo(tmp_path, monkeypatch) -> ModuleType:  # type: ignore[no-untyped-def]
    """scripts/demo.py loaded fresh, its manage.py subprocesses pointed at this test database."""
    for key, value in subprocess_env(CONTROLPLANE_VAR_DIR=str(tmp_path / "var")).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DEMO_PORT", raising=False)
    monkeypatch.delitem(sys.modules, "services", raising=False)  # demo.py imports scripts/services.py by name
    spec = importlib.util.spec_from_file_location("demo_script", BASE_DIR / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    yield module
    sys.modules.pop("services", None)


def _sign_in(host: str, username: str, password: str) -> Client:
    """The portal's real login form, CSRF included, on the given host."""
    client = Client(enforce_csrf_checks=True, HTTP_HOST=host)
    page = client.get("/login/")
    assert page.status_code == 200, page.status_code
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    signed_in = client.post("/login/", {"username": username, "password": password,
                                        "csrfmiddlewaretoken": token})
    assert signed_in.status_code == 302, signed_in.content.decode()[:500]
    return client


def test_the_demo_operator_portal_answers_on_its_localhost_name_and_the_printed_login_works(demo):
    demo.operator_token()
    password = demo.portal_password()
    operator = Operator.objects.get(slug="demo-ops")
    assert operator.domains == ["demo-ops.localhost"]
    secret = Path(demo.SECRETS / "demo-portal-password")
    assert secret.read_text().strip() == password and stat.S_IMODE(secret.stat().st_mode) == 0o600
    lines = demo.closing_lines(staff_password="staff-pw", portal_password=password)
    url = demo.portal_url()
    portal_line = next(line for line in lines if url in line)
    assert f"user: {demo.PORTAL_USER}" in portal_line and f"password: {password}" in portal_line
    assert any("/dashboard/" in line for line in lines)  # next to the dashboard's URL
    parts = urlsplit(url)
    assert parts.hostname == "demo-ops.localhost" and parts.port == demo.services.PORT and parts.path == "/"

    client = _sign_in(parts.netloc, demo.PORTAL_USER, password)
    home = client.get("/")
    assert home.status_code == 200 and "Demo Operator" in home.content.decode()
    assert client.get("/dashboard/").status_code == 404  # an operator host never serves the staff dashboard
    assert OperatorMembership.objects.get(user__username=demo.PORTAL_USER, operator=operator).role == "admin"
    # A second run of the demo reuses everything: same password, no second user, no second host name.
    assert demo.portal_password() == password
    assert User.objects.filter(username=demo.PORTAL_USER).count() == 1
    assert Operator.objects.get(pk=operator.pk).domains == ["demo-ops.localhost"]


def test_an_operator_from_an_older_demo_gets_its_portal_host(demo):
    operator_create(slug="demo-ops", name="Demo Operator", domains=["localhost"], actor=SYSTEM)
    demo.operator_token()  # exists: a new token instead
    password = demo.portal_password()
    assert Operator.objects.get(slug="demo-ops").domains == ["localhost", "demo-ops.localhost"]
    assert AuditLog.objects.filter(action="operator.domain.add", data__domain="demo-ops.localhost").exists()
    _sign_in(f"demo-ops.localhost:{demo.services.PORT}", demo.PORTAL_USER, password)


def test_ensure_portal_user_refuses_hosts_that_could_never_serve_the_portal():
    operator_create(slug="refusing", name="Refusing", actor=SYSTEM)
    operator_create(slug="holder", name="Holder", domains=["taken.localhost"], actor=SYSTEM)
    for host, reason in (("localhost", "control-plane host"), ("portal.example.org", "ALLOWED_HOSTS"),
                         ("taken.localhost", "another operator"), ("bad host", "not a host name")):
        with pytest.raises(CommandError, match=reason):
            call_command("ensure_portal_user", "refusing", "someone", domain=[host])
    assert Operator.objects.get(slug="refusing").domains == []
    assert not User.objects.filter(username="someone").exists()
    with pytest.raises(CommandError, match="no operator"):
        call_command("ensure_portal_user", "nobody", "someone")
