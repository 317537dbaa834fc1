"""Tenant A's database role against tenant B's schema and the control plane's tables: real permission errors."""

from __future__ import annotations

import secrets
import uuid

import psycopg
import pytest
from django.conf import settings
from psycopg import errors

from provisioning.drivers.base import TenantId, TenantSpec
from provisioning.drivers.pg_admin import admin_conninfo, tenant_conninfo
from provisioning.drivers.postgres_schema import PostgresSchemaDriver

pytestmark = pytest.mark.django_db


def _spec() -> TenantSpec:
    tid = uuid.uuid4()
    return TenantSpec(
        tenant_id=TenantId(str(tid)), resource_name=f"{settings.TENANT_NAME_PREFIX}{tid.hex}",
        operator_slug="op", secrets={"db_password": secrets.token_urlsafe(18)},
    )


@pytest.fixture
def two_tenants():  # type: ignore[no-untyped-def]
    driver = PostgresSchemaDriver()
    a, b = _spec(), _spec()
    refs = [driver.ensure(a), driver.ensure(b)]
    yield driver, (a, refs[0]), (b, refs[1])
    for spec, ref in ((a, refs[0]), (b, refs[1])):
        driver.delete(spec, ref)


def _connect(spec: TenantSpec) -> psycopg.Connection:
    return psycopg.connect(
        tenant_conninfo(role=spec.resource_name, password=spec.secrets["db_password"], schema=spec.resource_name),
        autocommit=True,
    )


def test_tenant_role_works_in_its_own_schema_only(two_tenants):
    _, (a, _), (b, _) = two_tenants
    with _connect(b) as conn_b:
        conn_b.execute("CREATE TABLE secrets_of_b (v text)")
        conn_b.execute("INSERT INTO secrets_of_b VALUES ('b-private')")
    with _connect(a) as conn:
        assert conn.execute("SELECT current_schema()").fetchone()[0] == a.resource_name
        conn.execute("CREATE TABLE notes (v text)")  # its own schema: allowed
        conn.execute("INSERT INTO notes VALUES ('a')")
        # B's table: no USAGE on B's schema.
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f'SELECT * FROM "{b.resource_name}".secrets_of_b')
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f'CREATE TABLE "{b.resource_name}".planted (v text)')
        # Cannot even list B's tables.
        listed = conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", (b.resource_name,)
        ).fetchone()[0]
        assert listed == 0
        # Cannot change its search_path into B's schema to reach the same table.
        conn.execute(f'SET search_path = "{b.resource_name}"')
        # PostgreSQL skips schemas the role may not use: the table simply is not there for A.
        with pytest.raises((errors.InsufficientPrivilege, errors.UndefinedTable)):
            conn.execute("SELECT * FROM secrets_of_b")


def test_tenant_role_cannot_touch_control_plane_tables_or_public(two_tenants):
    _, (a, _), _ = two_tenants
    with _connect(a) as conn:
        for table in ("tenants_tenant", "vault_credentialversion", "tenants_operatortoken"):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM public.{table}")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE public.planted (v text)")


def test_tenant_role_cannot_escalate(two_tenants):
    _, (a, _), (b, _) = two_tenants
    with _connect(a) as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f'SET ROLE "{b.resource_name}"')
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE ROLE sneaky LOGIN")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(f'ALTER ROLE "{b.resource_name}" PASSWORD \'x\'')
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("CREATE DATABASE sneaky")


def test_ensure_is_idempotent_and_repairs_drift(two_tenants):
    driver, (a, ref), _ = two_tenants
    assert driver.observe(a, ref).healthy
    again = driver.ensure(a)
    assert again == ref
    with psycopg.connect(**admin_conninfo(), autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA "{a.resource_name}" CASCADE')
        assert not driver.observe(a, ref).exists
        driver.ensure(a)
        assert driver.observe(a, ref).healthy
        count = admin.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (a.resource_name,)).fetchone()[0]
        assert count == 1


def test_password_reaches_the_server_only_as_a_scram_verifier(two_tenants):
    _, (a, _), _ = two_tenants
    with psycopg.connect(**admin_conninfo(), autocommit=True) as admin:
        stored = admin.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (a.resource_name,)).fetchone()[0]
    assert stored.startswith("SCRAM-SHA-256$4096:")
    assert a.secrets["db_password"] not in stored
