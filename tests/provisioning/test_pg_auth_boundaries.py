"""PostgreSQL authentication that means something: real logins over TCP 127.0.0.1 against servers these
tests start with SCRAM, tenants provisioned onto them through the real driver, the refusal of a trust
server (the machine's), and the embedded default (fresh, and upgraded in place from a trust data dir).

Only the refusal and the override tests touch TENANT_DATABASE_ALLOW_INSECURE_AUTH (the rest of the suite
runs with it on, see conftest.py); everything here turns it off first.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from psycopg import errors, sql

from controlplane import embedded_pg
from controlplane.errors import ProvisioningError
from provisioning.drivers import pg_auth
from provisioning.drivers.base import TenantId, TenantSpec
from provisioning.drivers.pg_admin import tenant_conninfo
from provisioning.drivers.postgres_schema import PostgresSchemaDriver
from tests.pg_servers import Server, running_scram_server

NO_PASSFILE = {"passfile": os.devnull}  # nothing but the password we pass (no ~/.pgpass, no PGPASSWORD)
# The machine's tenant database setting, before the module's SCRAM fixture repoints it (module-scoped, so it
# stays repointed until the module ends, whatever order pytest-django runs the tests in).
MACHINE_TENANT_DATABASE_URL = settings.TENANT_DATABASE_URL


def _spec() -> TenantSpec:
    tid = uuid.uuid4()
    return TenantSpec(tenant_id=TenantId(str(tid)), resource_name=f"{settings.TENANT_NAME_PREFIX}{tid.hex}",
                      operator_slug="op", secrets={"db_password": secrets.token_urlsafe(18)})


@pytest.fixture(scope="module")
def scram_server() -> Iterator[Server]:
    """A configured server: Debian's PostgreSQL 15, initdb --auth=scram-sha-256, its superuser's password set."""
    with running_scram_server() as server:
        yield server


@pytest.fixture(scope="module")
def tenants(scram_server: Server) -> Iterator[dict[str, TenantSpec]]:
    """Tenants A and B provisioned for real onto the SCRAM server, without the insecure-auth override."""
    saved = (settings.TENANT_DATABASE_URL, settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH)
    settings.TENANT_DATABASE_URL = scram_server.url("tenantdb")
    settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = False
    try:
        driver, specs = PostgresSchemaDriver(), {"a": _spec(), "b": _spec()}
        refs = {k: driver.ensure(s) for k, s in specs.items()}
        assert refs["a"].details["auth"] == "scram" and "auth_findings" not in refs["a"].details
        yield specs
    finally:
        settings.TENANT_DATABASE_URL, settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = saved


def _conninfo(spec: TenantSpec, password: str | None = None) -> str:
    return tenant_conninfo(role=spec.resource_name, password=spec.secrets["db_password"] if password is None
                           else password, schema=spec.resource_name)


def _refused(conninfo: str, **kwargs: object) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(conninfo, **NO_PASSFILE, **kwargs).close()  # type: ignore[arg-type]
    return str(caught.value)


# --- logins on the SCRAM server --------------------------------------------------------------------------

def test_a_role_logs_in_over_tcp_with_its_own_password_and_sees_its_schema(tenants: dict[str, TenantSpec]) -> None:
    a = tenants["a"]
    info = psycopg.conninfo.conninfo_to_dict(_conninfo(a))
    assert info["host"] == "127.0.0.1"
    with psycopg.connect(_conninfo(a), **NO_PASSFILE, autocommit=True) as conn:  # type: ignore[arg-type]
        assert conn.execute("SELECT current_user, current_schema(), inet_server_addr()::text").fetchone() == (
            a.resource_name, a.resource_name, "127.0.0.1/32")
        conn.execute("CREATE TABLE notes (body text)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
        assert conn.execute("SELECT body FROM notes").fetchone() == ("mine",)


@pytest.mark.parametrize("which", ["wrong", "b's", "none"])
def test_a_role_is_refused_with_a_wrong_password_b_password_or_none(tenants: dict[str, TenantSpec],
                                                                     which: str) -> None:
    a, b = tenants["a"], tenants["b"]
    if which == "none":
        info = psycopg.conninfo.conninfo_to_dict(_conninfo(a))
        info.pop("password")
        message = _refused(psycopg.conninfo.make_conninfo(**info))
        assert "no password supplied" in message  # the server asked for one (SCRAM), the client had none
        return
    password = "not-" + a.secrets["db_password"] if which == "wrong" else b.secrets["db_password"]
    message = _refused(_conninfo(a, password=password))
    assert f'password authentication failed for user "{a.resource_name}"' in message  # SQLSTATE 28P01


@pytest.mark.parametrize("password", ["", "not-the-superuser-password"])
def test_the_superuser_is_refused_without_its_password(scram_server: Server, password: str) -> None:
    info = psycopg.conninfo.conninfo_to_dict(scram_server.url("tenantdb", password=password))
    if not password:
        info.pop("password", None)
    message = _refused(psycopg.conninfo.make_conninfo(**info))
    assert ("no password supplied" in message if not password
            else 'password authentication failed for user "postgres"' in message)


def test_a_role_cannot_create_temporary_tables_in_its_own_database(tenants: dict[str, TenantSpec]) -> None:
    with psycopg.connect(_conninfo(tenants["a"]), **NO_PASSFILE, autocommit=True) as conn:  # type: ignore[arg-type]
        with pytest.raises(errors.InsufficientPrivilege) as caught:
            conn.execute("CREATE TEMP TABLE scratch (x int)")
    assert caught.value.sqlstate == "42501"
    assert "permission denied to create temporary tables" in str(caught.value)


@pytest.mark.django_db  # the posture reads the recorded database servers too
def test_public_has_no_connect_on_the_tenant_database_and_other_databases_are_reported_not_touched(
        scram_server: Server, tenants: dict[str, TenantSpec]) -> None:
    with psycopg.connect(scram_server.url("tenantdb"), autocommit=True) as admin:
        assert pg_auth.public_connect_databases(admin) == ["controlplane", "postgres", "template1"]
        acl = admin.execute("SELECT datacl::text[] FROM pg_database WHERE datname = 'tenantdb'").fetchone()[0]
    assert not any(item.startswith("=") for item in acl)  # no PUBLIC entry
    # A configured server's other databases are the operator's: reported (posture), not changed, so A still
    # reaches them until the operator applies the fix the posture names; then it is refused.
    posture = {line["boundary"]: line for line in pg_auth.database_posture() if "tenant database" in line["detail"]}
    assert posture["database auth"]["status"] == "pass"
    assert posture["database connect"]["status"] == "degraded"
    assert "controlplane" in posture["database connect"]["detail"]
    info = psycopg.conninfo.conninfo_to_dict(_conninfo(tenants["a"]))
    psycopg.connect(**{**info, "dbname": "controlplane"}, **NO_PASSFILE).close()  # type: ignore[arg-type]
    with psycopg.connect(scram_server.url("postgres"), autocommit=True) as admin:
        admin.execute("REVOKE CONNECT, TEMP ON DATABASE controlplane FROM PUBLIC")
    message = _refused(psycopg.conninfo.make_conninfo(**{**info, "dbname": "controlplane"}))
    assert 'permission denied for database "controlplane"' in message  # SQLSTATE 42501


# --- a server that trusts: refused, or provisioned with the override recorded -----------------------------

@pytest.mark.django_db
def test_provisioning_onto_a_trust_server_is_refused_naming_the_rule(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = False  # the machine's server trusts local connections
    settings.TENANT_DATABASE_URL = MACHINE_TENANT_DATABASE_URL
    spec = _spec()
    with pytest.raises(ProvisioningError) as caught:
        PostgresSchemaDriver().ensure(spec)
    detail = caught.value.detail
    assert "refusing to provision" in detail and "pg_hba.conf line" in detail
    assert " trust" in detail and "scram-sha-256" in detail and spec.resource_name in detail
    assert not PostgresSchemaDriver().observe(spec, None).exists  # type: ignore[arg-type]  # nothing was created


@pytest.mark.django_db
def test_with_the_override_a_trust_server_is_provisioned_and_recorded_as_insecure(settings) -> None:  # type: ignore[no-untyped-def]
    settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = True
    settings.TENANT_DATABASE_URL = MACHINE_TENANT_DATABASE_URL
    driver, spec = PostgresSchemaDriver(), _spec()
    ref = driver.ensure(spec)
    try:
        assert ref.details["auth"] == "insecure-override"
        assert any("trust" in f and "pg_hba.conf line" in f for f in ref.details["auth_findings"])
        posture = {line["boundary"]: line for line in pg_auth.database_posture()}
        assert posture["database auth"]["status"] == "fail" and "trust" in posture["database auth"]["detail"]
    finally:
        driver.delete(spec, ref)


# --- the embedded default ----------------------------------------------------------------------------------

def _stop_embedded(data_dir: Path) -> None:
    embedded_pg._pg_ctl(data_dir, "-w", "-m", "immediate", "stop")


def _hba_methods(server: embedded_pg.EmbeddedServer) -> list[tuple[str, str]]:
    with psycopg.connect(server.url("postgres")) as conn:
        return [(r[0], r[1]) for r in conn.execute("SELECT type, auth_method FROM pg_hba_file_rules")]


@pytest.fixture
def var_dir() -> Iterator[Path]:
    var = Path(tempfile.mkdtemp(prefix="cp-epg-"))
    try:
        yield var
    finally:
        if (var / "pgdata" / "postmaster.pid").exists():
            _stop_embedded(var / "pgdata")
        shutil.rmtree(var, ignore_errors=True)


def test_the_embedded_server_asks_every_role_for_its_password(var_dir: Path) -> None:
    server = embedded_pg.embedded_server(var_dir / "pgdata")
    assert (var_dir / "secrets" / "postgres-superuser-password").read_text().strip() == server.password
    methods = _hba_methods(server)
    assert methods and {m for _, m in methods} == {"scram-sha-256"} and ("local", "scram-sha-256") in methods
    for host in ("127.0.0.1", str(server.socket_dir)):
        assert "no password supplied" in _refused(f"host={host} port={server.port} user=postgres dbname=postgres")
        assert "password authentication failed" in _refused(
            f"host={host} port={server.port} user=postgres dbname=postgres password=wrong")
    with psycopg.connect(server.url("postgres")) as conn:
        open_dbs = pg_auth.public_connect_databases(conn)
        names = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
    assert open_dbs == [] and {"controlplane", "tenants"} <= names
    # A second start reuses the server and its port.
    assert embedded_pg.embedded_server(var_dir / "pgdata").port == server.port


def test_a_trust_initialised_embedded_data_dir_is_upgraded_in_place(var_dir: Path) -> None:
    import pgserver

    data = var_dir / "pgdata"
    old = pgserver.get_server(str(data), cleanup_mode=None)  # what earlier versions left behind: trust, socket only
    old.psql("CREATE DATABASE controlplane; \\c controlplane\nCREATE TABLE kept (x int); INSERT INTO kept VALUES (7);")
    socket_dir = old.get_postmaster_info().socket_dir
    psycopg.connect(host=str(socket_dir), user="postgres", dbname="postgres", **NO_PASSFILE).close()  # trusted
    pgserver.postgres_server.PostgresServer._instances.pop(data.resolve(), None)

    server = embedded_pg.embedded_server(data)
    assert {m for _, m in _hba_methods(server)} == {"scram-sha-256"}
    for host in (server.socket_dir, "127.0.0.1"):
        assert "no password supplied" in _refused(f"host={host} port={server.port} user=postgres dbname=postgres")
    with psycopg.connect(server.url("controlplane")) as conn:
        assert conn.execute("SELECT x FROM kept").fetchone() == (7,)  # same data, same server directory
    assert embedded_pg.embedded_server(data) == server  # idempotent


def test_a_tenant_on_the_embedded_default_reaches_its_database_over_tcp_and_no_other(var_dir: Path,
                                                                                      settings) -> None:  # type: ignore[no-untyped-def]
    server = embedded_pg.embedded_server(var_dir / "pgdata")
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE later")  # created after start: provisioning closes it too (product-owned)
    settings.TENANT_DATABASE_URL = server.url("tenants")
    settings.TENANT_DATABASE_EMBEDDED = True
    settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = False
    spec = _spec()
    ref = PostgresSchemaDriver().ensure(spec)
    assert ref.details["auth"] == "scram" and ref.details["dbname"] == "tenants"
    url = _conninfo(spec)
    info = psycopg.conninfo.conninfo_to_dict(url)
    assert (info["host"], info["port"]) == ("127.0.0.1", str(server.port)) and str(var_dir) not in url
    with psycopg.connect(url, **NO_PASSFILE) as conn:  # type: ignore[arg-type]
        assert conn.execute("SELECT current_schema()").fetchone() == (spec.resource_name,)
    for other in ("controlplane", "postgres", "template1", "later"):
        message = _refused(psycopg.conninfo.make_conninfo(url, dbname=other))
        assert f'permission denied for database "{other}"' in message
    with psycopg.connect(server.url("tenants")) as conn:
        assert conn.execute(sql.SQL("SELECT has_database_privilege({}, 'tenants', 'CONNECT')").format(
            sql.Literal(spec.resource_name))).fetchone() == (True,)


def test_without_a_superuser_the_server_is_probed_instead(scram_server: Server, tenants: dict[str, TenantSpec]) -> None:
    """A CREATEROLE admin cannot read pg_hba_file_rules: a login that must fail tells trust from SCRAM."""
    machine = psycopg.conninfo.conninfo_to_dict(os.environ.get("DATABASE_URL", "")) or {}
    if not machine.get("host"):
        pytest.skip("needs the machine's (trust) server in DATABASE_URL")
    name, password = f"{settings.TENANT_NAME_PREFIX}probe_{secrets.token_hex(3)}", secrets.token_urlsafe(12)
    servers = {"scram": psycopg.conninfo.conninfo_to_dict(scram_server.url("tenantdb")),
               "trust": {**machine, "dbname": "postgres"}}
    verdicts = {}
    for label, info in servers.items():
        with psycopg.connect(**info, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)))
            if label == "scram":  # PUBLIC has no CONNECT there any more (the tenants were provisioned)
                admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                    sql.Identifier(info["dbname"]), sql.Identifier(name)))
        try:
            with psycopg.connect(**{**info, "user": name, "password": password}, autocommit=True) as conn:
                with pytest.raises(errors.InsufficientPrivilege):
                    conn.execute("SELECT 1 FROM pg_hba_file_rules")
                verdicts[label] = pg_auth.auth_findings(conn, dbname=info["dbname"], role="t_any")
        finally:
            with psycopg.connect(**info, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
    assert verdicts["scram"] == []
    assert [f.refused for f in verdicts["trust"]] == [True] and "trusts it" in verdicts["trust"][0].sentence


def test_the_embedded_pgbouncer_admits_tenant_roles_by_their_own_password_and_nobody_else(var_dir: Path,
                                                                                         settings) -> None:  # type: ignore[no-untyped-def]
    """EMBEDDED_PGBOUNCER (controlplane/pgbouncer.py): the local profile's PgBouncer in front of the embedded
    server. Started once and reused (same pid, same port); a tenant role logs in through it with its SCRAM
    password (looked up through auth_query: no tenant password in its files) and lands in its own schema; a wrong
    password and the superuser are refused; it stops and comes back on the same port."""
    from controlplane import pgbouncer

    server = embedded_pg.embedded_server(var_dir / "pgdata")
    workdir = var_dir / "pgbouncer"
    try:
        port = pgbouncer.embedded_pgbouncer(workdir, server)
        pid = pgbouncer._running_pid(workdir)
        assert pid is not None
        assert pgbouncer.embedded_pgbouncer(workdir, server) == port and pgbouncer._running_pid(workdir) == pid
        settings.TENANT_DATABASE_URL = server.url("tenants")
        settings.TENANT_DATABASE_EMBEDDED = True
        settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = False
        spec = _spec()
        PostgresSchemaDriver().ensure(spec)
        password = spec.secrets["db_password"]
        pooled = psycopg.conninfo.make_conninfo(host="127.0.0.1", port=port, dbname="tenants",
                                                user=spec.resource_name, password=password)
        with psycopg.connect(pooled, **NO_PASSFILE, autocommit=True, prepare_threshold=None) as conn:  # type: ignore[arg-type]
            assert conn.execute("SELECT current_user, current_schema()").fetchone() == (spec.resource_name,) * 2
            assert conn.execute("SELECT inet_server_port()").fetchone() == (server.port,)  # the server behind it
        assert password not in _refused(psycopg.conninfo.make_conninfo(pooled, password="wrong-" + password))
        _refused(psycopg.conninfo.make_conninfo(pooled, user="postgres", password=server.password))
        files = "".join(p.read_text(errors="replace") for p in workdir.iterdir() if p.is_file())
        assert password not in files and server.password not in files
        assert pgbouncer.embedded_pgbouncer_stop(workdir) == pid and pgbouncer._running_pid(workdir) is None
        assert pgbouncer.embedded_pgbouncer(workdir, server) == port  # back, on the port it keeps
        with psycopg.connect(pooled, **NO_PASSFILE, autocommit=True, prepare_threshold=None) as conn:  # type: ignore[arg-type]
            assert conn.execute("SELECT current_user").fetchone() == (spec.resource_name,)
    finally:
        pgbouncer.embedded_pgbouncer_stop(workdir)


def test_an_embedded_pgbouncer_that_cannot_start_is_one_runtime_error_without_the_password(tmp_path: Path) -> None:
    """The settings fall back to direct connections on RuntimeError; a database error (here: no server on the
    port) must arrive as one too, never crash every process that reads the settings, and name no password."""
    import socket

    from controlplane import pgbouncer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    password = "embedded-" + secrets.token_urlsafe(12)
    server = embedded_pg.EmbeddedServer(data_dir=tmp_path / "pgdata", port=port, password=password)
    with pytest.raises(RuntimeError, match="could not be started") as failed:
        pgbouncer.embedded_pgbouncer(tmp_path / "pgbouncer", server)
    assert password not in str(failed.value)
    assert pgbouncer.embedded_pgbouncer_port(tmp_path / "pgbouncer") is None
