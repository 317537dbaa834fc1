"""Several tenant database servers: placement, per-tenant reads, draining, and a changed setting.

Two real PostgreSQL servers: the machine's (where ``TENANT_DATABASE_URL`` points in the suite) and a SCRAM
server of Debian's PostgreSQL 15 started for this module (``tests/pg_servers.py``), recorded with a DSN that
carries no password (the control plane finds it in a libpq passfile, as an operator's would).
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from rest_framework.test import APIClient

from controlplane.errors import Conflict, ProvisioningError
from provisioning.databases.servers import (
    database_server_activate,
    database_server_add,
    database_server_drain,
    database_servers_load,
    settings_server_ensure,
    tenant_database_server,
)
from provisioning.drivers.pg_admin import settings_conninfo, tenant_admin_connect
from provisioning.models import AgentInstance, DatabasePlacement, DatabaseServer, ProvisionedResource
from tenants.actors import SYSTEM
from tenants.models import Tenant
from tests.conftest import wait_for
from tests.pg_servers import Server, running_scram_server
from vault.choices import DB_PASSWORD_CREDENTIAL
from vault.services import credential_reveal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def second_server() -> Iterator[Server]:
    with running_scram_server() as server:
        yield server


def _tenants(operator, n: int) -> list[Tenant]:  # type: ignore[no-untyped-def]
    """Tenant rows only: placement happens at the first need of a server, before any resource exists."""
    return [Tenant.objects.create(operator=operator, slug=f"t-{secrets.token_hex(4)}", name="T") for _ in range(n)]


def test_new_tenants_go_to_the_least_loaded_active_server_until_every_one_is_full(operator,
                                                                                  second_server) -> None:
    default = settings_server_ensure()
    default.capacity = 2
    default.save()
    second = database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn(), capacity=4)

    placed = Counter(tenant_database_server(t).name for t in _tenants(operator, 6))
    assert placed == {"default": 2, "second": 4}  # by load (placed / capacity), to exactly the capacity
    loads = {s.name: s.tenants for s in database_servers_load()}
    assert loads == {"default": 2, "second": 4}

    [extra] = _tenants(operator, 1)
    with pytest.raises(ProvisioningError, match="no tenant database server can take a new tenant"):
        tenant_database_server(extra)
    assert not DatabasePlacement.objects.filter(tenant=extra).exists()

    # A draining server takes no one even with room; an existing placement never moves by itself.
    second.capacity = 10
    second.save()
    database_server_drain(name="second", actor=SYSTEM)
    with pytest.raises(ProvisioningError):
        tenant_database_server(extra)
    database_server_activate(name="second", actor=SYSTEM)
    assert tenant_database_server(extra).name == "second"


def test_a_record_never_holds_a_password_and_names_each_database_once(second_server) -> None:
    url = second_server.url("tenantdb")
    with pytest.raises(ProvisioningError, match="carries a password") as refused:
        database_server_add(name="leaky", actor=SYSTEM, dsn=url)
    assert second_server.password not in str(refused.value)
    assert not DatabaseServer.objects.filter(name="leaky").exists()
    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    with pytest.raises(Conflict, match="already names that database"):
        database_server_add(name="again", actor=SYSTEM, dsn=second_server.passfile_dsn())
    with pytest.raises(ProvisioningError, match="not a libpq connection string"):
        database_server_add(name="garbled", actor=SYSTEM, dsn="host='unterminated")
    default = settings_server_ensure()
    assert "password" not in psycopg.conninfo.conninfo_to_dict(default.dsn)


def test_changing_the_setting_moves_new_tenants_only(operator, second_server, settings) -> None:  # type: ignore[no-untyped-def]
    [old] = _tenants(operator, 1)
    assert tenant_database_server(old).name == "default"
    # The operator repoints TENANT_DATABASE_URL at the second server (password in the URL, as settings may be).
    settings.TENANT_DATABASE_URL = second_server.url("tenantdb")
    [new] = _tenants(operator, 1)
    assert tenant_database_server(new).name == "default-2"
    assert tenant_database_server(old).name == "default"  # its schema is where it always was
    assert DatabaseServer.objects.get(name="default").state == "draining"
    # The old tenant is still read from the machine's server, the new one from the second.
    with tenant_admin_connect(old, autocommit=True) as conn:
        assert conn.info.port == int(settings_conninfo_of_machine().get("port") or 5432)
    with tenant_admin_connect(new, autocommit=True) as conn:
        assert conn.info.port == second_server.port


def settings_conninfo_of_machine() -> dict[str, object]:
    return psycopg.conninfo.conninfo_to_dict(DatabaseServer.objects.get(name="default").dsn)


def _onboard(api: APIClient, slug: str) -> Tenant:
    resp = api.post("/api/v1/tenants", data=json.dumps({"slug": slug, "name": slug, "allow_no_release": True}),
                    content_type="application/json")
    assert resp.status_code == 202, resp.content
    tenant_id = resp.json()["id"]
    wait_for(lambda: Tenant.objects.get(pk=tenant_id).status in ("ready", "failed"), timeout=120, what="ready")
    tenant = Tenant.objects.get(pk=tenant_id)
    assert tenant.status == "ready", tenant.status_reason
    return tenant


def _schema_on(dsn_or_url: str, name: str) -> bool:
    with psycopg.connect(dsn_or_url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (name,)).fetchone() is not None


def test_tenants_on_two_servers_run_each_against_its_own_and_cannot_log_in_on_the_other(
        api, worker_factory, second_server) -> None:  # type: ignore[no-untyped-def]
    worker = worker_factory()
    default = settings_server_ensure()
    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn(), capacity=5)
    database_server_drain(name="default", actor=SYSTEM)
    far = _onboard(api, "far-away")
    database_server_activate(name="default", actor=SYSTEM)
    database_server_drain(name="second", actor=SYSTEM)
    near = _onboard(api, "near-by")
    assert (tenant_database_server(far).name, tenant_database_server(near).name) == ("second", "default")

    machine = psycopg.conninfo.make_conninfo(**settings_conninfo())
    assert _schema_on(second_server.url("tenantdb"), far.resource_name)
    assert not _schema_on(machine, far.resource_name)
    assert _schema_on(machine, near.resource_name) and not _schema_on(second_server.url("tenantdb"),
                                                                       near.resource_name)
    far_db = ProvisionedResource.objects.get(tenant=far, kind="database").details
    assert (far_db["server"], far_db["port"], far_db["auth"]) == ("second", str(second_server.port), "scram")
    assert DatabaseServer.objects.get(name="second").auth == "scram"

    # Each instance booted and works against its own server: its boot is in its schema there.
    for tenant in (far, near):
        assert AgentInstance.objects.get(tenant=tenant).status == "running", worker.log()[-2000:]
        with tenant_admin_connect(tenant, autocommit=True) as conn:
            boots = conn.execute(f'SELECT count(*) FROM "{tenant.resource_name}".host_events'
                                 " WHERE kind = 'boot'").fetchone()[0]
        assert boots >= 1

    # The far tenant's own role and password: accepted on its server, unknown on the other.
    password = credential_reveal(tenant=far, name=DB_PASSWORD_CREDENTIAL, actor=SYSTEM)
    with psycopg.connect(host="127.0.0.1", port=second_server.port, dbname="tenantdb", user=far.resource_name,
                         password=password, autocommit=True) as conn:
        assert conn.execute("SELECT current_schemas(false)").fetchone()[0] == [far.resource_name]
    machine_info = settings_conninfo()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(**{**machine_info, "user": far.resource_name, "password": password}).close()
    assert default.name == "default"
    # No admin credential of either server reaches the records the API and dashboard read.
    assert second_server.password not in json.dumps([ProvisionedResource.objects.get(tenant=far, kind="database")
                                                    .details, list(DatabaseServer.objects.values())], default=str)


def test_the_command_lists_adds_drains_and_checks_with_clear_refusals(second_server) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    call_command("database_servers", "add", "second", second_server.passfile_dsn(), "--capacity", "7", stdout=out)
    assert "database server second added (active, capacity 7)" in out.getvalue()
    call_command("database_servers", "drain", "second", stdout=out)
    out = StringIO()
    call_command("database_servers", "check", stdout=out)
    table = out.getvalue()
    assert "second" in table and "draining" in table and "PostgreSQL 15" in table and "default" in table
    assert second_server.password not in table
    with pytest.raises(CommandError, match="carries a password"):
        call_command("database_servers", "add", "leaky", second_server.url("tenantdb"), stdout=out)
    with pytest.raises(CommandError, match="no database server named 'nope'"):
        call_command("database_servers", "drain", "nope", stdout=out)
    from tenants.models import AuditLog

    assert set(AuditLog.objects.filter(action__startswith="database_server.").values_list("action", flat=True)) \
        == {"database_server.add", "database_server.draining"}


def test_the_isolation_posture_checks_every_recorded_server_and_names_one_that_does_not_answer(second_server) -> None:
    from provisioning.drivers.pg_auth import database_posture

    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    database_server_add(name="gone", actor=SYSTEM, dsn="host=127.0.0.1 port=1 dbname=tenantdb user=postgres")
    lines = database_posture()
    second = [line for line in lines if "server second" in line["detail"]]
    auth = {line["boundary"]: line["status"] for line in second}
    assert auth["database auth"] == "pass", second  # SCRAM on every pg_hba line
    # Its other databases (postgres, controlplane) still let PUBLIC connect: reported, not changed for you.
    assert auth["database connect"] == "degraded", second
    gone = [line for line in lines if "server gone" in line["detail"]]
    assert [line["status"] for line in gone] == ["fail"] and "OperationalError" in gone[0]["detail"]
    assert second_server.password not in json.dumps(lines)


def test_set_changes_capacity_pooler_and_standby_and_refuses_a_password(second_server) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    database_server_add(name="second", actor=SYSTEM, dsn=second_server.passfile_dsn())
    out = StringIO()
    call_command("database_servers", "set", "second", "--capacity", "3", "--pooler",
                 "host=127.0.0.1 port=6432 dbname=tenantdb", stdout=out)
    assert "capacity 3, pooler yes, standby no" in out.getvalue()
    server = DatabaseServer.objects.get(name="second")
    assert (server.capacity, server.pooler_dsn) == (3, "host=127.0.0.1 port=6432 dbname=tenantdb")
    call_command("database_servers", "set", "second", "--pooler", "", stdout=out)
    assert DatabaseServer.objects.get(name="second").pooler_dsn == ""
    with pytest.raises(CommandError, match="standby_dsn carries a password"):
        call_command("database_servers", "set", "second", "--standby", second_server.url("tenantdb"), stdout=out)
    from tenants.models import AuditLog

    assert AuditLog.objects.filter(action="database_server.update").count() == 2
    assert second_server.password not in json.dumps(list(AuditLog.objects.values("data")), default=str)


def test_the_settings_server_is_made_once_under_concurrent_first_use_and_takes_any_number_of_tenants() -> None:
    import threading

    from django.db import connection as django_connection

    from provisioning.databases.servers import SETTINGS_SERVER_CAPACITY

    barrier, made = threading.Barrier(6), []

    def first_use() -> None:
        try:
            barrier.wait(timeout=10)
            made.append(settings_server_ensure().name)
        finally:
            django_connection.close()

    threads = [threading.Thread(target=first_use) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert made == ["default"] * 6
    assert list(DatabaseServer.objects.values_list("name", "state")) == [("default", "active")]
    # No hidden limit on a single-server install: the 1,001st tenant is placed like the first.
    assert DatabaseServer.objects.get(name="default").capacity == SETTINGS_SERVER_CAPACITY >= 1_000_000


def test_the_pooler_setting_puts_pgbouncer_in_front_of_the_settings_server(operator, settings) -> None:  # type: ignore[no-untyped-def]
    """``TENANT_DATABASE_POOLER_URL``: the local profile's way to put a PgBouncer in front of the tenant server by
    configuration. The settings record takes it (made with it, or changed to it), instances placed there get the
    pooler's address and no startup options; a password in it is refused without being repeated; an empty setting
    leaves what staff set with ``database_servers set default --pooler``. (Instances running through a real
    PgBouncer from such a record: tests/provisioning/test_pooled_instances.py.)"""
    from provisioning.drivers.pg_admin import tenant_conninfo, tenant_pooled

    pooler = "host=127.0.0.1 port=6499 dbname=tenantdb"
    settings.TENANT_DATABASE_POOLER_URL = pooler
    server = settings_server_ensure()
    assert (server.name, server.pooler_dsn) == ("default", pooler)
    assert tenant_pooled("default")
    url = psycopg.conninfo.conninfo_to_dict(tenant_conninfo(role="t_x", password="pw", schema="t_x", server="default"))
    assert (url["host"], url["port"], url["dbname"], url["user"]) == ("127.0.0.1", "6499", "tenantdb", "t_x")
    assert "options" not in url  # a transaction pooler refuses startup options
    tenant = _tenants(operator, 1)[0]
    assert tenant_database_server(tenant).name == "default"

    settings.TENANT_DATABASE_POOLER_URL = "host=127.0.0.1 port=6500 dbname=tenantdb"
    assert settings_server_ensure().pooler_dsn.endswith("port=6500 dbname=tenantdb")  # a changed setting applies
    settings.TENANT_DATABASE_POOLER_URL = ""
    assert settings_server_ensure().pooler_dsn.endswith("port=6500 dbname=tenantdb")  # empty: the record keeps it
    settings.TENANT_DATABASE_POOLER_URL = "postgresql://u:hunter2-secret@127.0.0.1:6432/tenantdb"
    with pytest.raises(ProvisioningError, match="TENANT_DATABASE_POOLER_URL carries a password") as refused:
        settings_server_ensure()
    assert "hunter2" not in str(refused.value)
    assert DatabaseServer.objects.get(name="default").pooler_dsn.endswith("port=6500 dbname=tenantdb")
