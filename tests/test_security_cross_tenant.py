"""Issue 8.3: attack every tenant boundary with real credentials on real services.

Two customers (of two operators) are onboarded by a real Celery worker through the real workflow
(PostgreSQL schema + login role, volume, object-store prefix, vault keys, instance token; the runtime
start is deferred: nothing here needs a running agent). Then, holding everything tenant A's instance
is given (its exact environment: database DSN, object-store URL and key, volume path, instance token),
we go after B: its schema, its objects, its credentials, its heartbeats, its volume. And with operator
A's API token we go after B's customer by id, slug and guessed ids. Every attempt fails; the instance's
cross-tenant credential attempts leave ``security.*`` audit rows.
"""

from __future__ import annotations

import base64
import io
import json
import os
import secrets
import tarfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors
from rest_framework.test import APIClient

from agent_runtime.crypto import open_sealed
from agent_runtime.errors import CorruptState, ObjectKeyRefused
from agent_runtime.state.objectstore import EncryptedObjectStore, objectstore_from_url
from agent_runtime.state.workspace import restore_snapshot
from tests.conftest import Worker, wait_for

pytestmark = pytest.mark.django_db

INSTANCE_ENV_KEYS = ("AGENT_TENANT_ID", "AGENT_SCHEMA", "AGENT_DATABASE_URL", "AGENT_VOLUME", "AGENT_OBJECTSTORE_URL",
                     "AGENT_OBJECT_KEY", "AGENT_INSTANCE_TOKEN")
B_SECRET = "b-only-secret-value-4c1f"


@pytest.fixture(scope="module")
def pair(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    """Two onboarded tenants, committed for the whole module (flushed afterwards, like a transactional test)."""
    from django.core.management import call_command

    from provisioning.drivers.local_process import instance_environment
    from provisioning.resources.spec import tenant_spec
    from provisioning.workflows.onboarding import tenant_onboard
    from tenants.actors import SYSTEM
    from tenants.models import Tenant
    from tenants.services import operator_create
    from tenants.tokens import operator_token_issue
    from vault.services import credential_put

    with django_db_blocker.unblock():
        tag = secrets.token_hex(3)
        op_a = operator_create(slug=f"xt-a-{tag}", name="Operator A", actor=SYSTEM)
        op_b = operator_create(slug=f"xt-b-{tag}", name="Operator B", actor=SYSTEM)
        worker = Worker(PROVISIONING_RUNTIME_DRIVER="deferred")
        try:
            tenant_a, _ = tenant_onboard(allow_no_release=True, operator=op_a, slug="alpha", name="Alpha", actor=SYSTEM)
            tenant_b, _ = tenant_onboard(allow_no_release=True, operator=op_b, slug="bravo", name="Bravo", actor=SYSTEM)
            for tenant in (tenant_a, tenant_b):
                wait_for(lambda t=tenant: Tenant.objects.get(pk=t.pk).status in ("ready", "failed"), timeout=90,
                         what=f"{tenant.slug} onboarded")
                tenant.refresh_from_db()
                assert tenant.status == "ready", (tenant.status_reason, worker.log()[-3000:])
        finally:
            worker.stop()
        credential_put(tenant=tenant_b, name="mail-b", value=B_SECRET, actor=SYSTEM)
        secrets_wanted = ("db_password", "object_key_b64", "instance_token")
        env = {name: instance_environment(tenant_spec(t, with_secrets=secrets_wanted))
               for name, t in (("a", tenant_a), ("b", tenant_b))}
        world = {
            "tenant_a": tenant_a, "tenant_b": tenant_b, "env_a": env["a"], "env_b": env["b"],
            "token_a": operator_token_issue(operator=op_a, actor=SYSTEM).plaintext,
            "token_b": operator_token_issue(operator=op_b, actor=SYSTEM).plaintext,
        }
        # B's agent has written a table and an object of its own.
        with psycopg.connect(env["b"]["AGENT_DATABASE_URL"], autocommit=True) as conn:
            conn.execute("CREATE TABLE b_private (v text)")
            conn.execute("INSERT INTO b_private VALUES ('b-private-row')")
        _store(env["b"]).put("notes/secret.txt", b"b-private-object")
    yield world
    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


def _store(env: dict[str, str]) -> EncryptedObjectStore:
    """The object store exactly as the instance builds it from its environment."""
    return EncryptedObjectStore(objectstore_from_url(env["AGENT_OBJECTSTORE_URL"]),
                                base64.b64decode(env["AGENT_OBJECT_KEY"]), env["AGENT_TENANT_ID"])


def _instance_client(env: dict[str, str]) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {env['AGENT_INSTANCE_TOKEN']}")
    return client


def _operator_client(token: str) -> APIClient:
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _b_values(pair: dict[str, Any]) -> list[str]:
    env_b = pair["env_b"]
    return [B_SECRET, env_b["AGENT_INSTANCE_TOKEN"], env_b["AGENT_OBJECT_KEY"], env_b["AGENT_SCHEMA"],
            str(pair["tenant_b"].pk), "bravo"]


# --- what A's instance is given ---------------------------------------------------------------------------


def test_a_instance_environment_names_only_its_own_resources(pair):
    env_a, env_b = pair["env_a"], pair["env_b"]
    assert set(INSTANCE_ENV_KEYS) <= set(env_a)
    leaked = [key for key, value in env_a.items() for b in (env_b[k] for k in INSTANCE_ENV_KEYS)
              if b and b in value and key != "AGENT_CONTROL_PLANE_URL"]
    assert not leaked
    assert env_a["AGENT_SCHEMA"] in env_a["AGENT_DATABASE_URL"]
    assert env_b["AGENT_SCHEMA"] not in env_a["AGENT_DATABASE_URL"]


# --- database ---------------------------------------------------------------------------------------------


def test_a_db_role_cannot_read_or_write_b_schema_or_escalate(pair):
    schema_b, role_b = pair["env_b"]["AGENT_SCHEMA"], pair["env_b"]["AGENT_SCHEMA"]
    with psycopg.connect(pair["env_a"]["AGENT_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS mine (v text)")  # its own schema: fine
        attempts = [
            f'SELECT * FROM "{schema_b}".b_private',
            f"INSERT INTO \"{schema_b}\".b_private VALUES ('from-a')",
            f'CREATE TABLE "{schema_b}".planted (v text)',
            f'DROP TABLE "{schema_b}".b_private',
            f'SET ROLE "{role_b}"',
            f'ALTER ROLE "{role_b}" PASSWORD \'taken-over\'',
            f'GRANT USAGE ON SCHEMA "{schema_b}" TO CURRENT_USER',
            "SELECT * FROM public.vault_credentialversion",
            "SELECT * FROM public.tenants_auditlog",
            "SELECT * FROM public.provisioning_agentinstance",
            "SELECT * FROM public.tenants_operatortoken",
            "CREATE TABLE public.planted (v text)",
            "SELECT pg_read_file('/etc/passwd')",
            "COPY (SELECT 1) TO PROGRAM 'true'",
            "SELECT lo_import('/etc/passwd')",
            "CREATE ROLE sneaky LOGIN",
        ]
        for sql in attempts:
            with pytest.raises((errors.InsufficientPrivilege, errors.UndefinedTable, errors.InvalidSchemaName)):
                conn.execute(sql)
        listed = conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                              (schema_b,)).fetchone()[0]
        assert listed == 0
    with psycopg.connect(pair["env_b"]["AGENT_DATABASE_URL"], autocommit=True) as conn:
        assert conn.execute("SELECT v FROM b_private").fetchall() == [("b-private-row",)]


def test_a_password_does_not_open_b_role(pair):
    """B's role only accepts B's password: checked against the SCRAM verifier the server stores.

    (The server decides with that verifier under ``scram-sha-256`` in pg_hba.conf, which production must
    use; this machine's PostgreSQL trusts local connections, so a login attempt would prove nothing.)
    """
    import base64 as b64
    import hashlib
    import hmac

    from provisioning.drivers.pg_admin import admin_conninfo

    def password(env: dict[str, str]) -> str:
        return psycopg.conninfo.conninfo_to_dict(env["AGENT_DATABASE_URL"])["password"]

    with psycopg.connect(**admin_conninfo(), autocommit=True) as admin:
        stored = admin.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                               (pair["env_b"]["AGENT_SCHEMA"],)).fetchone()[0]
    method, rest = stored.split("$", 1)
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored_key = b64.b64decode(keys.split(":")[0])

    def opens(candidate: str) -> bool:
        salted = hashlib.pbkdf2_hmac("sha256", candidate.encode(), b64.b64decode(salt), int(iterations))
        client_key = hmac.new(salted, b"Client Key", "sha256").digest()
        return hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key)

    assert method == "SCRAM-SHA-256"
    assert opens(password(pair["env_b"]))  # the check itself works
    assert not opens(password(pair["env_a"]))
    assert password(pair["env_a"]) != password(pair["env_b"])


# --- object store -----------------------------------------------------------------------------------------


def test_a_object_store_cannot_reach_b_prefix(pair):
    store_a = _store(pair["env_a"])
    b_id = pair["env_b"]["AGENT_TENANT_ID"]
    b_root = Path(objectstore_from_url(pair["env_b"]["AGENT_OBJECTSTORE_URL"]).root)
    for key in (f"../{b_id}/notes/secret.txt", f"../../tenants/{b_id}/notes/secret.txt",
                str(b_root / "notes/secret.txt"),
                "notes/../../x", "..\\x", "notes//secret.txt", f"./../{b_id}/notes/secret.txt", "a\x00b"):
        with pytest.raises(ObjectKeyRefused):
            store_a.get(key)
        with pytest.raises(ObjectKeyRefused):
            store_a.put(key, b"planted-by-a")
    assert "notes/secret.txt" not in store_a.list()
    assert _store(pair["env_b"]).get("notes/secret.txt") == b"b-private-object"


def test_a_key_cannot_decrypt_b_objects_even_with_the_bytes_in_hand(pair):
    b_root = Path(objectstore_from_url(pair["env_b"]["AGENT_OBJECTSTORE_URL"]).root)
    blob = (b_root / "notes" / "secret.txt").read_bytes()  # an attacker with raw read access to the bucket
    assert b"b-private-object" not in blob
    key_a = base64.b64decode(pair["env_a"]["AGENT_OBJECT_KEY"])
    for tenant_id in (pair["env_a"]["AGENT_TENANT_ID"], pair["env_b"]["AGENT_TENANT_ID"]):
        with pytest.raises(CorruptState):
            open_sealed(key_a, tenant_id, "notes/secret.txt", blob)
    # Planting B's ciphertext inside A's own prefix does not make it readable by A either.
    store_a = _store(pair["env_a"])
    store_a.inner.put("stolen.txt", blob)
    with pytest.raises(CorruptState):
        store_a.get("stolen.txt")


# --- volume -----------------------------------------------------------------------------------------------


def test_a_snapshot_restore_cannot_write_into_b_volume(pair, tmp_path):
    volume_a, volume_b = Path(pair["env_a"]["AGENT_VOLUME"]), Path(pair["env_b"]["AGENT_VOLUME"])
    assert oct(volume_b.stat().st_mode & 0o777) == "0o700" and oct(volume_a.stat().st_mode & 0o777) == "0o700"
    target = os.path.relpath(volume_b / "workspace" / "planted.txt", volume_a / "workspace")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in (target, str(volume_b / "workspace" / "planted-abs.txt")):
            info = tarfile.TarInfo(name)
            info.size = 5
            tar.addfile(info, io.BytesIO(b"owned"))
    store_a = _store(pair["env_a"])
    store_a.put("snapshots/evil.tar.gz", buf.getvalue())
    with pytest.raises(CorruptState):
        restore_snapshot(store_a, "snapshots/evil.tar.gz", volume_a / "workspace", "0" * 64)
    assert not list(volume_b.rglob("planted*"))


# --- the control plane's internal endpoints with A's instance token ----------------------------------------


def test_a_instance_cannot_fetch_b_credentials_and_each_attempt_is_audited(pair):
    from tenants.models import AuditLog

    client = _instance_client(pair["env_a"])
    b_id = str(pair["tenant_b"].pk)
    attempts = [
        "/internal/v1/credentials/mail-b",
        f"/internal/v1/credentials/mail-b?tenant={b_id}&tenant_id={b_id}",
        "/internal/v1/credentials/..%2Fmail-b",
        f"/internal/v1/credentials/{b_id}%2Fmail-b",
        "/internal/v1/credentials/system.instance-token",
        "/internal/v1/credentials/system.db-password",
    ]
    for path in attempts:
        resp = client.get(path, HTTP_X_TENANT_ID=b_id)
        assert resp.status_code == 404, (path, resp.status_code)
        assert not any(v in resp.content.decode() for v in _b_values(pair)[:3]), path
    rows = AuditLog.objects.filter(action="security.cross_tenant_attempt", tenant=pair["tenant_a"])
    assert rows.count() >= 4  # mail-b by name (3 spellings reach the name) and the reserved names B also has
    assert all(b_id in row.data["owner_tenant_ids"] for row in rows)
    assert {r.actor_kind for r in rows} == {"instance"}
    assert not AuditLog.objects.filter(action="credential.deliver", tenant=pair["tenant_b"]).exists()


def test_a_instance_gets_only_its_own_object_keys(pair):
    resp = _instance_client(pair["env_a"]).get(f"/internal/v1/object-keys?tenant={pair['tenant_b'].pk}")
    assert resp.status_code == 200
    keys = {k["key_b64"] for k in resp.json()["keys"]}
    assert pair["env_a"]["AGENT_OBJECT_KEY"] in keys and pair["env_b"]["AGENT_OBJECT_KEY"] not in keys


def test_a_instance_cannot_write_b_heartbeat(pair):
    from provisioning.models import AgentInstance
    from provisioning.recovery.heartbeats import heartbeat_store

    instance_a = AgentInstance.objects.get(tenant=pair["tenant_a"])
    instance_b = AgentInstance.objects.get(tenant=pair["tenant_b"])
    store = heartbeat_store()
    before = store.get(str(instance_b.pk))
    body = {"status": "idle", "progress_seq": 999, "instance_id": str(instance_b.pk),
            "tenant": str(instance_b.tenant_id)}
    resp = _instance_client(pair["env_a"]).post(f"/internal/v1/heartbeat?instance={instance_b.pk}",
                                                data=json.dumps(body),
                                                content_type="application/json")
    assert resp.status_code == 204
    assert store.get(str(instance_b.pk)) == before
    assert store.get(str(instance_a.pk)).progress_seq == 999


def test_instance_token_is_refused_by_the_operator_api_and_operator_token_by_internal(pair):
    b_id = pair["tenant_b"].pk
    client = _instance_client(pair["env_a"])
    for path in ("/api/v1/tenants", f"/api/v1/tenants/{b_id}", f"/api/v1/tenants/{b_id}/recoveries",
                 f"/api/v1/tenants/{b_id}/credentials", f"/api/v1/tenants/{pair['tenant_a'].pk}/recoveries"):
        assert client.get(path).status_code == 401, path
    operator = _operator_client(pair["token_a"])
    for path in ("/internal/v1/credentials/mail-b", "/internal/v1/object-keys"):
        assert operator.get(path).status_code == 401, path


# --- operator A's API token against operator B's customer ------------------------------------------------


def _guesses(pair: dict[str, Any]) -> list[str]:
    b = pair["tenant_b"]
    return [str(b.pk), str(b.pk).upper(), b.pk.hex, "{" + str(b.pk) + "}", f"urn:uuid:{b.pk}", b.slug,
            str(uuid.UUID(int=b.pk.int + 1)), str(uuid.uuid4()), "1", "0", "-1", "..", "%2e%2e", "*", "' OR '1'='1"]


def test_operator_a_cannot_see_or_touch_b_customer_by_id_slug_or_guess(pair):
    from tenants.models import Tenant

    client = _operator_client(pair["token_a"])
    for guess in _guesses(pair):
        for method, suffix in (("get", ""), ("delete", ""), ("get", "/recoveries"), ("get", "/credentials"),
                               ("get", "/credentials/mail-b"), ("delete", "/credentials/mail-b")):
            resp = getattr(client, method)(f"/api/v1/tenants/{guess}{suffix}")
            assert resp.status_code in (404, 400), (method, guess, suffix, resp.status_code)
            assert B_SECRET not in resp.content.decode()
        resp = client.put(f"/api/v1/tenants/{guess}/credentials/mail-b", data=json.dumps({"value": "overwritten"}),
                          content_type="application/json")
        assert resp.status_code in (404, 400), (guess, resp.status_code)
    assert Tenant.objects.get(pk=pair["tenant_b"].pk).status == "ready"
    from vault.models import Credential

    mail_b = Credential.objects.get(tenant=pair["tenant_b"], name="mail-b")
    assert mail_b.current_version == 1 and mail_b.revoked_at is None


def test_operator_a_list_filters_never_reach_b(pair):
    client = _operator_client(pair["token_a"])
    b = pair["tenant_b"]
    # Parameters the list does not take are refused outright (400 naming them), never half-applied.
    for query in (f"operator={b.operator_id}", f"operator_id={b.operator_id}", f"id={b.pk}", f"tenant={b.pk}",
                  "offset=0&limit=1&operator=*"):
        resp = client.get(f"/api/v1/tenants?{query}")
        assert resp.status_code == 400 and "unknown query parameters" in resp.json()["detail"], query
        assert not any(v in resp.content.decode() for v in _b_values(pair)), query
    for query in (f"slug={b.slug}", "search=bravo", "status=ready", "limit=500", f"plan={b.plan_id}",
                  "created_after=2000-01-01T00:00:00Z"):
        resp = client.get(f"/api/v1/tenants?{query}")
        assert resp.status_code == 200, query
        ids = {t["id"] for t in resp.json()["results"]}
        assert ids <= {str(pair["tenant_a"].pk)}, query
        assert not any(v in resp.content.decode() for v in _b_values(pair)), query
