"""Tenant schema archives: ``pg_dump`` → gzip → encrypt with the tenant's object key → object store,
and the way back. Used before dropping a schema (deprovisioning), by the periodic backup job,
and to restore a schema dropped behind our back (recovery).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import subprocess
import threading
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from psycopg import sql

from controlplane.embedded_pg import bundled_pg_bin
from controlplane.errors import ProvisioningError
from provisioning.choices import ResourceKind
from provisioning.databases.servers import tenant_database_server
from provisioning.drivers.pg_admin import admin_connect, admin_conninfo
from provisioning.drivers.registry import objectstore_driver
from provisioning.models import ProvisionedResource
from tenants.models import Tenant
from vault.choices import KeyPurpose
from vault.envelope import object_aad, open_sealed, seal
from vault.services import tenant_data_key_ensure, tenant_data_key_unwrap_verified, tenant_object_key
from vault.shredding import sealed_archive_record

__all__ = ["schema_archive", "schema_copy", "schema_restore_latest", "latest_archive", "schema_dump",
           "schema_load"]


def _pg_bin(name: str) -> str:
    bundled = bundled_pg_bin(name)
    return str(bundled) if bundled.exists() else (shutil.which(name) or name)


def _conn_args(tenant: Tenant, server: str | None = None) -> tuple[list[str], dict[str, str]]:
    """pg_dump/psql arguments for ``server`` (None: the one holding the tenant's schema, its placement)."""
    info = admin_conninfo(tenant_database_server(tenant).name if server is None else server)
    args = ["--dbname", str(info.get("dbname", ""))]
    for flag, key in (("--host", "host"), ("--port", "port"), ("--username", "user")):
        if info.get(key):
            args += [flag, str(info[key])]
    extra = {"PGPASSFILE": str(info["passfile"])} if info.get("passfile") else {}
    return args, {**os.environ, "PGPASSWORD": str(info.get("password", "")), **extra}


def schema_dump(tenant: Tenant, server: str | None = None) -> bytes:
    """A plain-SQL ``pg_dump`` of the tenant's schema on ``server`` (None: its placement), without owners."""
    conn_args, env = _conn_args(tenant, server)
    done = subprocess.run([_pg_bin("pg_dump"), "--schema", tenant.resource_name, "--no-owner", "--no-privileges",
                           *conn_args], env=env, capture_output=True, timeout=600, check=False)
    if done.returncode != 0:
        raise ProvisioningError(f"pg_dump failed: {done.stderr.decode(errors='replace')[-500:]}")
    return done.stdout


def schema_archive(*, tenant: Tenant, label: str = "schema") -> dict[str, Any]:
    """Archive the tenant's schema; the newest archive is recorded on its database resource.

    Recorded only once it has been read back from the store and opened: callers (deprovisioning)
    delete the schema next. A vault that cannot open the tenant's object key fails before the dump.
    """
    key = tenant_data_key_ensure(tenant=tenant, purpose=KeyPurpose.OBJECTS)
    # Unwrapped afresh, and only under a key-encryption key every process has: an archive sealed
    # with a data key that only this process could open would be lost with this process.
    object_key = tenant_data_key_unwrap_verified(key=key)
    dump = schema_dump(tenant)
    name = f"{label}-{timezone.now():%Y%m%dT%H%M%S%f}.sql.gz.enc"
    blob = seal(object_key, gzip.compress(dump), object_aad(str(tenant.id), f"archives/{name}"))
    taken = timezone.now()
    url = objectstore_driver().archives().put(str(tenant.pk), name, blob)
    expires = taken + timedelta(days=settings.SCHEMA_ARCHIVE_RETENTION_DAYS)
    # Recorded as soon as it is stored (the expiry job's inventory would find it too, by reading it back):
    # the row keeps the key version that sealed it alive until the archive expires (vault.shredding).
    sealed_archive_record(tenant=tenant, name=name, url=url, label=label, key_version=key.version,
                          size_bytes=len(blob), taken_at=taken, expires_at=expires)
    archive = {"archive_url": url, "archive_expires_at": expires.isoformat(), "archive_bytes": len(blob),
               "archive_key_version": key.version, "archive_name": name, "archive_label": label,
               "archive_taken_at": timezone.now().timestamp()}
    # Read it back from the store and open it before it counts: deprovisioning drops the schema next.
    if _read_archive(tenant, archive) != dump:
        raise ProvisioningError(f"the archive {name} read back from the object store differs from the dump")
    resource = ProvisionedResource.objects.get(tenant=tenant, kind=ResourceKind.DATABASE)
    resource.details = {**resource.details, **archive}
    resource.save(update_fields=["details", "updated_at"])
    return archive


def latest_archive(tenant: Tenant) -> dict[str, Any] | None:
    resource = ProvisionedResource.objects.filter(tenant=tenant, kind=ResourceKind.DATABASE).first()
    if resource is None or not resource.details.get("archive_url"):
        return None
    return resource.details


def _read_archive(tenant: Tenant, details: dict[str, Any]) -> bytes:
    url = details["archive_url"]
    blob = objectstore_driver().archives().get(str(tenant.pk), details["archive_name"])
    key = tenant_object_key(tenant=tenant, version=details["archive_key_version"])
    name = details.get("archive_name") or url.rsplit("/", 1)[-1]
    return gzip.decompress(open_sealed(key, blob, object_aad(str(tenant.id), f"archives/{name}")))


def schema_restore_latest(*, tenant: Tenant) -> str:
    """Recreate a missing schema from its newest archive, owned by the tenant's role again.

    The schema itself is created by the database driver's ``ensure`` beforehand; the dump's own
    ``CREATE SCHEMA`` is skipped, objects are restored as the admin, then handed to the tenant.
    """
    details = latest_archive(tenant)
    if details is None:
        raise ProvisioningError(f"schema {tenant.resource_name} is gone and there is no archive to restore from")
    schema_load(tenant, _read_archive(tenant, details))
    return details["archive_url"]


def _psql_load_command(tenant: Tenant, server: str | None) -> tuple[list[str], dict[str, str]]:
    """psql reading a load from stdin. Not ``--single-transaction``: that commits at end of input, also when the
    input ends early because the writer died mid-stream; the load is wrapped in BEGIN ... COMMIT by the caller
    instead, COMMIT written last, so an input cut short ends psql's session with the transaction rolled back."""
    conn_args, env = _conn_args(tenant, server)
    return [_pg_bin("psql"), "--no-psqlrc", "--quiet", "--set", "ON_ERROR_STOP=1", *conn_args], env


def schema_load(tenant: Tenant, dump: bytes, server: str | None = None) -> None:
    """Load a ``schema_dump`` into the tenant's (existing, empty) schema on ``server``, owned by its role.

    The schema itself is created by the database driver's ``ensure`` beforehand; the dump's own
    ``CREATE SCHEMA`` is skipped, objects are loaded as the admin in one transaction, then handed to the tenant.
    """
    name = tenant.resource_name
    text = "\n".join(line for line in dump.decode().splitlines() if not line.startswith(f"CREATE SCHEMA {name};"))
    argv, env = _psql_load_command(tenant, server)
    done = subprocess.run(argv, input=b"BEGIN;\n" + text.encode() + b"\nCOMMIT;\n", env=env, capture_output=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise ProvisioningError(f"restoring the schema failed: {done.stderr.decode(errors='replace')[-500:]}")
    _hand_schema_to_tenant(tenant, server)


def schema_copy(tenant: Tenant, *, source: str, target: str, timeout_s: float = 3600) -> int:
    """``pg_dump`` of the tenant's schema on ``source`` piped into ``psql`` on ``target`` (one transaction),
    line by line: a move never holds the whole dump in memory. Returns the bytes that went through.

    Like ``schema_load``: the target schema exists (empty) beforehand, the dump's ``CREATE SCHEMA`` is dropped
    from the stream, and everything loaded is then handed to the tenant's role. Either side failing, or this
    process dying mid-stream, fails the copy with nothing committed on the target: COMMIT is written only after
    pg_dump exited 0 (see ``_psql_load_command``).
    """
    skip = f"CREATE SCHEMA {tenant.resource_name};".encode()
    dump_args, dump_env = _conn_args(tenant, source)
    load_argv, load_env = _psql_load_command(tenant, target)
    copied = 0
    with subprocess.Popen([_pg_bin("pg_dump"), "--schema", tenant.resource_name, "--no-owner", "--no-privileges",
                           *dump_args], env=dump_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as dump, \
            subprocess.Popen(load_argv, env=load_env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE) as load:
        assert dump.stdout is not None and load.stdin is not None
        # Both stderrs drained beside the copy: a full pipe there would stall the process writing to it.
        errors: dict[str, bytes] = {}
        drains = [threading.Thread(target=lambda k=k, f=f: errors.__setitem__(k, f.read()), daemon=True)
                  for k, f in (("dump", dump.stderr), ("load", load.stderr)) if f is not None]
        for drain in drains:
            drain.start()
        try:
            load.stdin.write(b"BEGIN;\n")
            for line in dump.stdout:
                copied += len(line)
                if not line.startswith(skip):
                    load.stdin.write(line)
            if dump.wait(timeout=timeout_s) == 0:  # the whole dump went through: only then commit it
                load.stdin.write(b"\nCOMMIT;\n")
            load.stdin.close()
        except BrokenPipeError:
            # psql stopped (an error; its exit status says why, below). pg_dump would block on a pipe nobody
            # reads any more, and the wait for it would last the whole timeout.
            dump.kill()
            with contextlib.suppress(BrokenPipeError):
                load.stdin.close()  # closed now, so the Popen exit does not flush into the broken pipe again
        loaded, dumped = load.wait(timeout=timeout_s), dump.wait(timeout=timeout_s)
        for drain in drains:
            drain.join(timeout=timeout_s)
        dump_err, load_err = errors.get("dump", b""), errors.get("load", b"")
        if loaded != 0:  # first: a pg_dump killed because psql stopped is not the cause
            raise ProvisioningError(f"loading the schema failed: {load_err.decode(errors='replace')[-500:]}")
        if dumped != 0:  # psql's input ended without COMMIT: nothing of it was kept
            raise ProvisioningError(f"pg_dump failed: {dump_err.decode(errors='replace')[-500:]}")
    _hand_schema_to_tenant(tenant, target)
    return copied


def _hand_schema_to_tenant(tenant: Tenant, server: str | None) -> None:
    """Everything in the tenant's schema on ``server`` (loaded by the admin) becomes its role's."""
    name = tenant.resource_name
    ident = sql.Identifier(name)
    target = tenant_database_server(tenant).name if server is None else server
    with admin_connect(target) as conn, conn.cursor() as cur:
        cur.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(ident, ident))
        # Tables first (their serial sequences follow them), then whatever is still not the tenant's.
        for kinds, what in ((("r", "p"), "TABLE"), (("v",), "VIEW"), (("m",), "MATERIALIZED VIEW"),
                            (("S",), "SEQUENCE")):
            rows = cur.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = ANY(%s) AND pg_get_userbyid(c.relowner) <> %s",
                (name, list(kinds), name),
            ).fetchall()
            for (relname,) in rows:
                cur.execute(sql.SQL("ALTER {} {}.{} OWNER TO {}").format(
                    sql.SQL(what), ident, sql.Identifier(relname), ident))
        # Functions too (the runtime's single-writer fence is one): the tenant owns everything in its schema.
        for (proc,) in cur.execute(
                "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = %s AND pg_get_userbyid(p.proowner) <> %s", (name, name)).fetchall():
            cur.execute(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(sql.SQL(proc), ident))
