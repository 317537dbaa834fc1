"""Issue 8.5: deployment hardening. ``check --deploy`` is clean with production settings, production refuses
development secrets, security headers (CSP, HSTS over TLS, frame denial) are on every page and the pages
still work under the CSP, cookies are secure, and every form refuses a POST without its CSRF token."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.test import Client

from controlplane.security import production_settings_problems
from tests.conftest import BASE_DIR, SESSION_TMP, subprocess_env
from tests.security_world import (
    PORTAL_A_ADMIN,
    STAFF,
    World,
    shared_world,
)
from tests.test_security_authz_matrix import PORTAL, ROWS

pytestmark = pytest.mark.django_db


def production_env(**extra: str) -> dict[str, str]:
    env = subprocess_env(
        DJANGO_ENV="production",
        SECRET_KEY=secrets.token_urlsafe(50),
        VAULT_KEK_KEYRING="v1:" + base64.b64encode(os.urandom(32)).decode(),
        ALLOWED_HOSTS="controlplane.example.com,.portals.example.com",
        CELERY_BROKER_URL="redis://127.0.0.1:6379/15",
        TRUST_X_FORWARDED_PROTO="true",
        CONTROLPLANE_OBJECTSTORE="s3",
        S3_BUCKET="agent-tenants",
        EMAIL_URL="smtp+tls://mail.example.com:587",
    )
    # DJANGO_ALLOW_ASYNC_UNSAFE is set in this process by the browser tests (Playwright): not production's.
    # TENANT_DATABASE_ALLOW_INSECURE_AUTH and CONTROLPLANE_FAULT_INJECTION are the test suite's (conftest.py),
    # refused in production.
    for key in ("DJANGO_ALLOW_ASYNC_UNSAFE", "DEBUG", "SECURE_TLS", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE",
                "CSRF_COOKIE_SECURE",
                "SECURE_HSTS_SECONDS", "TENANT_DATABASE_ALLOW_INSECURE_AUTH", "CONTROLPLANE_FAULT_INJECTION"):
        env.pop(key, None)
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=env, capture_output=True,
                          text=True, timeout=120)


# --- production settings ------------------------------------------------------------------------------------


def test_check_deploy_is_clean_with_production_settings():
    """Django's own deploy checks pass; what remains is the isolation posture of this machine's services.

    The CI machine's PostgreSQL trusts every local login and its Redis needs no password, so the isolation
    checks (provisioning.E1xx, ``provisioning/fleet/posture.py``) must say so: that is them working, not noise.
    Against servers that do ask for passwords they are silent (tests/provisioning/test_isolation_attacks.py).
    """
    result = manage(production_env(), "check", "--deploy", "--fail-level", "WARNING")
    output = result.stdout + result.stderr
    ids = set(re.findall(r"\(([a-z_]+\.[EWI]\d+)\)", output))
    assert ids, output
    assert {i for i in ids if not i.startswith("provisioning.")} == set(), output
    assert "provisioning.E105" in ids and "database auth fails" in output  # pg_hba.conf: trust
    assert "provisioning.E107" in ids and "answers without a password" in output  # the machine's Redis
    assert result.returncode != 0


def test_production_settings_values():
    code = ("import json; from django.conf import settings as s; print(json.dumps({k: getattr(s, k) for k in "
            "['DEBUG', 'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
            "'SESSION_COOKIE_HTTPONLY', "
            "'CSRF_COOKIE_HTTPONLY', 'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'X_FRAME_OPTIONS', "
            "'SECURE_CONTENT_TYPE_NOSNIFF', 'SECURE_REFERRER_POLICY', 'SECURE_PROXY_SSL_HEADER', "
            "'SECURE_REDIRECT_EXEMPT']}))")
    result = manage(production_env(), "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values["DEBUG"] is False
    for key in ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SESSION_COOKIE_HTTPONLY",
                "CSRF_COOKIE_HTTPONLY", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_CONTENT_TYPE_NOSNIFF"):
        assert values[key] is True, key
    assert values["SECURE_HSTS_SECONDS"] >= 31536000
    assert values["X_FRAME_OPTIONS"] == "DENY" and values["SECURE_REFERRER_POLICY"] == "same-origin"
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert r"^internal/" in values["SECURE_REDIRECT_EXEMPT"]


@pytest.mark.parametrize(("extra", "needle"), [
    ({"CONTROLPLANE_OBJECTSTORE": "local"}, "CONTROLPLANE_OBJECTSTORE must be s3"),
    ({"CONTROLPLANE_OBJECTSTORE": ""}, "CONTROLPLANE_OBJECTSTORE must be s3"),
    ({"EMAIL_URL": ""}, "EMAIL_URL must be set"),
])
def test_production_refuses_state_on_one_machines_disk(extra, needle):
    """A release wheel kept on one machine's disk cannot be installed by another: refused at start, by name."""
    result = manage(production_env(**extra), "check")
    assert result.returncode != 0
    assert "refusing to start with DJANGO_ENV=production" in result.stderr and needle in result.stderr, \
        result.stderr[-2000:]


@pytest.mark.parametrize("case", ["no SECRET_KEY", "dev SECRET_KEY", "no key ring", "dev key ring", "DEBUG"])
def test_production_refuses_to_start_with_development_secrets(case):
    var = SESSION_TMP / "var"
    dev_key = (var / "secrets" / "django-secret-key")
    dev_ring = (var / "secrets" / "vault-keyring")
    for path, value in ((dev_key, secrets.token_urlsafe(50)),
                        (dev_ring, "v1:" + base64.b64encode(os.urandom(32)).decode())):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)
    extra = {
        "no SECRET_KEY": {"SECRET_KEY": ""},
        "dev SECRET_KEY": {"SECRET_KEY": dev_key.read_text()},
        "no key ring": {"VAULT_KEK_KEYRING": ""},
        "dev key ring": {"VAULT_KEK_KEYRING": dev_ring.read_text()},
        "DEBUG": {"DEBUG": "true"},
    }[case]
    result = manage(production_env(**extra), "check")
    assert result.returncode != 0
    assert "refusing to start with DJANGO_ENV=production" in result.stderr
    for value in extra.values():  # the message names the problem, never the secret
        assert not value or len(value) < 8 or value not in result.stderr


def test_production_settings_problems_covers_every_development_default(tmp_path):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "django-secret-key").write_text("k" * 10 + secrets.token_urlsafe(50))
    good = {"SECRET_KEY": secrets.token_urlsafe(50), "VAULT_KEK_KEYRING": "v1:x", "DATABASE_URL": "postgresql://db/x",
            "ALLOWED_HOSTS": "cp.example.com", "CONTROLPLANE_OBJECTSTORE": "s3", "S3_BUCKET": "b",
            "EMAIL_URL": "smtp://mail.example.com"}

    def problems(**changes: object) -> list[str]:
        environ = {k: v for k, v in {**good, **changes}.items() if v is not None}
        return production_settings_problems(environ=environ, debug=False, var_dir=tmp_path, kek_provider="local",
                                            broker_url="redis://r/0")

    assert problems() == []
    assert problems(SECRET_KEY="short")
    assert problems(SECRET_KEY="django-insecure-" + "x" * 60)
    assert problems(SECRET_KEY=(tmp_path / "secrets" / "django-secret-key").read_text())
    assert problems(DATABASE_URL=None) and problems(ALLOWED_HOSTS=None) and problems(VAULT_KEK_KEYRING=None)
    assert problems(TENANT_DATABASE_ALLOW_INSECURE_AUTH="true")
    assert not problems(TENANT_DATABASE_ALLOW_INSECURE_AUTH="false")
    assert problems(EGRESS_ALLOW_PRIVATE_ADDRESSES="true") and not problems(EGRESS_ALLOW_PRIVATE_ADDRESSES="false")
    # The demo's loopback grants (every isolated instance reaching named loopback services): development only.
    assert any("LOCAL_INSTANCE_LOOPBACK_GRANTS must be empty" in p
               for p in problems(LOCAL_INSTANCE_LOOPBACK_GRANTS="127.0.0.1:8026"))
    assert not problems(LOCAL_INSTANCE_LOOPBACK_GRANTS="")
    assert problems(LOCAL_INSTANCE_ISOLATION="off")
    assert not problems(LOCAL_INSTANCE_ISOLATION="off", PROVISIONING_PROFILE="kubernetes")
    assert not problems(LOCAL_INSTANCE_ISOLATION="required")
    assert problems(CONTROLPLANE_FAULT_INJECTION="1") and problems(VAULT_ROTATION_PAUSE_PER_ITEM_S="1")
    # Nothing that must be shared between the control plane's machines may live on one machine's disk.
    assert any("CONTROLPLANE_OBJECTSTORE must be s3" in p for p in problems(CONTROLPLANE_OBJECTSTORE=None))
    assert any("CONTROLPLANE_OBJECTSTORE must be s3" in p for p in problems(CONTROLPLANE_OBJECTSTORE="local"))
    assert any("S3_BUCKET must be set" in p for p in problems(S3_BUCKET=None))
    assert any("EMAIL_URL must be set" in p for p in problems(EMAIL_URL=None))
    assert production_settings_problems(environ=good, debug=False, var_dir=tmp_path, kek_provider="local",
                                        broker_url="filesystem://")
    embedded = f"redis+socket://:{'p' * 48}@{tmp_path}/redis/redis.sock"  # the embedded Redis (issue 31)
    assert production_settings_problems(environ=good, debug=False, var_dir=tmp_path, kek_provider="local",
                                        broker_url=embedded)
    assert production_settings_problems(environ=good, debug=False, var_dir=tmp_path, kek_provider="aws-kms",
                                        broker_url="redis://r/0")


# --- headers ------------------------------------------------------------------------------------------------


def test_security_headers_on_pages_api_and_static(client):
    for path in ("/dashboard/login/", "/api/v1/tenants", "/api/docs/", "/healthz", "/static/ui/app.css"):
        resp = client.get(path)
        assert resp.status_code in (200, 401), path
        csp = resp["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp, path
        script_src = re.search(r"script-src ([^;]*)", csp).group(1)
        assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src and "http" not in script_src
        assert resp["X-Frame-Options"] == "DENY", path
        assert resp["X-Content-Type-Options"] == "nosniff", path
        assert resp["Referrer-Policy"] == "same-origin", path


def test_hsts_only_over_tls_and_http_is_redirected_except_internal(settings):
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    settings.SECURE_SSL_REDIRECT = True
    client = Client()
    assert "Strict-Transport-Security" not in client.get("/healthz")
    tls = client.get("/dashboard/login/", secure=True)
    assert tls["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    plain = client.get("/dashboard/login/")
    assert plain.status_code == 301 and plain["Location"].startswith("https://")
    for path in ("/internal/v1/object-keys", "/healthz", "/metrics"):
        assert client.get(path).status_code != 301, path


def test_session_and_csrf_cookies_are_secure_httponly_and_samesite(settings, django_user_model):
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    django_user_model.objects.create_user("cookie-staff", password="a-long-test-password-1", is_staff=True)
    client = Client()
    page = client.get("/dashboard/login/", secure=True)
    csrf = page.cookies["csrftoken"]
    resp = client.post("/dashboard/login/", {"username": "cookie-staff", "password": "a-long-test-password-1"},
                       secure=True)
    assert resp.status_code == 302
    session = resp.cookies["sessionid"]
    for cookie in (csrf, session):
        assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Lax", cookie.key


# --- pages under the CSP ------------------------------------------------------------------------------------


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str | None] = []
        self.styles: list[str] = []
        self.handlers: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts.append(a.get("src"))
        if tag == "link" and a.get("rel") == "stylesheet":
            self.styles.append(a["href"] or "")
        self.handlers += [k for k, v in attrs if k.startswith("on") or (v or "").strip().startswith("javascript:")]


@pytest.fixture(scope="module")
def _module_world(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    # Built once and never committed; every test rolls back its own writes (tests/security_world.py).
    with shared_world(django_db_blocker) as world:
        yield world


@pytest.fixture
def world(_module_world, db):  # type: ignore[no-untyped-def]
    _module_world.reset()  # as freshly built: stub memory, cached targets, throttle counters
    return _module_world


def test_dashboard_portal_and_swagger_pages_load_only_same_origin_scripts(world: World):
    pages = [
        (world.client(STAFF), "/dashboard/"), (world.client(STAFF), f"/dashboard/tenants/{world.tenant_a.pk}/"),
        (world.client(STAFF), f"/dashboard/tenants/{world.tenant_a.pk}/actions/suspend/"),
        (world.client(PORTAL_A_ADMIN, portal=True), "/"), (world.client(PORTAL_A_ADMIN, portal=True), "/branding/"),
        (world.client(PORTAL_A_ADMIN, portal=True), f"/customers/{world.tenant_a.pk}/"),
        (Client(), "/api/docs/"), (Client(), "/admin/login/"),
    ]
    fetched = set()
    for client, path in pages:
        resp = client.get(path)
        assert resp.status_code == 200, path
        assets = _Assets()
        assets.feed(resp.content.decode())
        assert assets.scripts, path
        assert None not in assets.scripts, f"{path} has an inline script the CSP would block"
        assert not assets.handlers, f"{path} has inline event handlers: {assets.handlers}"
        for url in [*assets.scripts, *assets.styles]:
            assert url.startswith("/"), f"{path} loads {url} from another origin"
            if url not in fetched:
                asset = client.get(url)
                assert asset.status_code == 200, url
                b"".join(asset.streaming_content) if asset.streaming else asset.content
                fetched.add(url)
    assert any("swagger-ui-bundle" in u for u in fetched) and any("htmx" in u for u in fetched)


def test_templates_have_no_inline_scripts():
    for template in Path(BASE_DIR, "templates").rglob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), template
        assert not re.search(r"\son[a-z]+=", text), template


# --- CSRF ---------------------------------------------------------------------------------------------------


def test_every_post_form_in_the_templates_carries_the_csrf_token():
    forms = 0
    for template in Path(BASE_DIR, "templates").rglob("*.html"):
        text = template.read_text()
        for match in re.finditer(r"<form[^>]*method=\"post\"[^>]*>(.*?)</form>", text, re.S | re.I):
            forms += 1
            assert "{% csrf_token %}" in match.group(1), f"{template}: a POST form without csrf_token"
    assert forms >= 8


HTML_POST_ROWS = [r for r in ROWS if r.method == "POST" and not r.route.startswith(("api/", "internal/"))]


@pytest.mark.parametrize("row", HTML_POST_ROWS, ids=lambda r: r.id)
def test_every_form_view_refuses_a_post_without_the_csrf_token(world, row):
    actor = sorted(row.allowed - {"anonymous"})[0] if row.allowed - {"anonymous"} else "anonymous"
    client = world.client(actor, portal=row.urlconf == PORTAL, enforce_csrf_checks=True)
    kwargs = row.body(world, actor) if row.body is not None else {}
    resp = client.post(row.path(world), **kwargs)
    assert resp.status_code == 403, (row.id, actor, resp.status_code)
    assert b"CSRF" in resp.content


# --- the image and the web server -----------------------------------------------------------------------------


def test_the_control_plane_image_contains_every_installed_app_and_the_server_config():
    from django.conf import settings

    dockerfile = (BASE_DIR / "deploy/docker/controlplane.Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) ", dockerfile, re.M))
    local_apps = {app.split(".")[0] for app in settings.INSTALLED_APPS if (BASE_DIR / app.split(".")[0]).is_dir()}
    assert local_apps <= copied, f"the image would not start: {sorted(local_apps - copied)} not copied"
    assert "deploy/gunicorn.conf.py" in copied
    import yaml

    web = yaml.safe_load((BASE_DIR / "deploy/kubernetes/40-web.yaml").read_text().split("\n---\n")[0])
    compose = yaml.safe_load((BASE_DIR / "deploy/compose.yaml").read_text())
    for command in (web["spec"]["template"]["spec"]["containers"][0]["command"], compose["services"]["web"]["command"]):
        assert command[:3] == ["gunicorn", "--config", "/app/gunicorn.conf.py"], command
    config = yaml.safe_load((BASE_DIR / "deploy/kubernetes/20-config.yaml").read_text())
    assert config["data"]["DJANGO_ENV"] == "production"
