"""pgvector at provisioning: the database step records whether the tenant's server has it (the machine's
PostgreSQL 15 does not), and on a server that ships it (an embedded pgserver started here) the control plane
creates the extension in `extensions` and grants the tenant role USAGE on that schema only."""

from __future__ import annotations

import os
import secrets
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from psycopg import errors

from provisioning.drivers.base import TenantId, TenantSpec
from provisioning.drivers.pg_admin import admin_conninfo, tenant_conninfo
from provisioning.drivers.postgres_schema import PostgresSchemaDriver
from provisioning.models import ProvisionedResource
from provisioning.workflows.onboarding import tenant_onboard
from provisioning.workflows.steps import StepContext, step_database
from tenants.actors import SYSTEM

pytestmark = pytest.mark.django_db


def _spec() -> TenantSpec:
    tid = uuid.uuid4()
    return TenantSpec(tenant_id=TenantId(str(tid)), resource_name=f"{settings.TENANT_NAME_PREFIX}{tid.hex}",
                      operator_slug="op", secrets={"db_password": secrets.token_urlsafe(18)})


def test_database_resource_records_whether_the_server_has_pgvector(operator) -> None:  # type: ignore[no-untyped-def]
    """In CI the tenant server is the machine's PostgreSQL 15 (no pgvector): the record says false. The
    embedded default (pgserver, PostgreSQL 16) ships it: there it says true."""
    with psycopg.connect(**admin_conninfo()) as conn:
        shipped = conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    tenant, _ = tenant_onboard(operator=operator, slug=f"pgv-{secrets.token_hex(3)}", name="Pgv",
                               actor=SYSTEM, allow_no_release=True)
    try:
        step_database(StepContext(tenant))
        details = ProvisionedResource.objects.get(tenant=tenant, kind="database").details
        if shipped == (0,):
            assert details["pgvector"] is False and "does not ship" in details["pgvector_detail"]
        else:
            assert details["pgvector"] is True and details["vector_schema"]
    finally:
        from provisioning.drivers.base import Ref
        from provisioning.resources.spec import tenant_spec

        PostgresSchemaDriver().delete(tenant_spec(tenant), Ref(""))


@pytest.fixture
def pgvector_server(settings) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The driver pointed (TENANT_DATABASE_URL) at an embedded PostgreSQL 16 with pgvector, stopped afterwards."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

        data = tempfile.mkdtemp(prefix="pgv-cp-")
        os.environ.setdefault("XDG_RUNTIME_DIR", data + "-run")
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        settings.TENANT_DATABASE_URL = server.get_uri()
        yield server.get_uri()
    finally:
        server.cleanup()


def test_driver_creates_the_extension_and_grants_only_its_schema(pgvector_server: str) -> None:
    driver = PostgresSchemaDriver()
    a, b = _spec(), _spec()
    ref_a, ref_b = driver.ensure(a), driver.ensure(b)
    assert ref_a.details["pgvector"] is True and ref_a.details["vector_schema"] == "extensions"
    assert driver.ensure(a).details == ref_a.details  # idempotent
    with psycopg.connect(pgvector_server, autocommit=True) as admin:
        assert admin.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
                             " WHERE e.extname = 'vector'").fetchone() == ("extensions",)
    conninfo = {s.resource_name: tenant_conninfo(role=s.resource_name, password=s.secrets["db_password"],
                                                 schema=s.resource_name) for s in (a, b)}
    with psycopg.connect(conninfo[b.resource_name], autocommit=True) as cb:
        cb.execute("CREATE TABLE notes (id int, e extensions.vector(3))")
        cb.execute("INSERT INTO notes VALUES (1, '[1,2,3]')")
    with psycopg.connect(conninfo[a.resource_name], autocommit=True) as ca:
        ca.execute("CREATE TABLE mine (e extensions.vector(3))")
        ca.execute("INSERT INTO mine VALUES ('[1,0,0]')")
        assert ca.execute("SELECT e OPERATOR(extensions.<=>) '[0,1,0]' FROM mine").fetchone() == (1.0,)
        with pytest.raises(errors.InsufficientPrivilege):
            ca.execute(f'SELECT e FROM "{b.resource_name}".notes')
        with pytest.raises(errors.InsufficientPrivilege):
            ca.execute("CREATE TABLE extensions.planted (v int)")
    driver.delete(b, ref_b)
    driver.delete(a, ref_a)
