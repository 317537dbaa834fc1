"""The control plane reads the runtime's tables in one place, and that place matches the runtime's schema.

Two halves of one contract (issue 36, "one reader of the runtime's tables"):

- no control-plane module but ``provisioning/resources/runtime_tables.py`` holds SQL naming a runtime table: the
  table names come from agent_runtime's migrations, not from a list kept here, so a table the runtime adds is covered;
- every function of ``provisioning.resources.runtime_tables`` runs against a schema migrated by agent_runtime's latest
  migration: PostgreSQL resolves every table and column when it plans a query, even on empty tables, so a
  migration that renames or drops a column the control plane reads fails here, not in production.
"""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agent_runtime.db import connect
from agent_runtime.state.migrations import LATEST_VERSION, MIGRATIONS, VERSION_TABLE, migrate
from provisioning.resources import runtime_tables
from tests import source_ast
from tests.runtime.harness import TenantDB, admin_dsn, create_tenant_db, drop_tenant_db

ROOT = Path(__file__).resolve().parents[2]
READER = ROOT / "provisioning" / "resources" / "runtime_tables.py"


def runtime_tables_from_migrations() -> set[str]:
    """Every table agent_runtime's versioned migrations create in a tenant schema, and its version table."""
    names = {m.group(1) for ddl in MIGRATIONS.values()
             for m in re.finditer(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", ddl, re.IGNORECASE)}
    return names | {VERSION_TABLE}


def control_plane_packages() -> list[str]:
    """The control plane's packages: import-linter's root packages, less the runtime itself."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return [p for p in config["root_packages"] if p != "agent_runtime"]


def sql_naming(source: str, tables: set[str]) -> list[tuple[int, str]]:
    """(line, table) for every string in ``source`` that reads as SQL naming one of ``tables``: after
    FROM/JOIN/UPDATE/INTO/TABLE (optionally schema-qualified), or qualified by a schema placeholder or literal
    (``{}.tasks``, ``'.host_lease'``), or passed whole to ``sql.Identifier``."""
    alternatives = "|".join(sorted(map(re.escape, tables)))
    after_keyword = re.compile(
        rf"\b(?:FROM|JOIN|UPDATE|INTO|TABLE)\s+(?:ONLY\s+)?(?:[\w\"{{}}%]+\s*\.\s*)?\"?({alternatives})\b",
        re.IGNORECASE)
    qualified = re.compile(rf"(?:\}}|'|\")\.\"?({alternatives})\b")
    found: list[tuple[int, str]] = []
    for node in ast.walk(source_ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for pattern in (after_keyword, qualified):
                found += [(node.lineno, m.group(1)) for m in pattern.finditer(node.value)]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "Identifier"):
            found += [(node.lineno, a.value) for a in node.args
                      if isinstance(a, ast.Constant) and a.value in tables]
    return found


def test_the_table_list_comes_from_the_runtime() -> None:
    tables = runtime_tables_from_migrations()
    assert {"host_events", "step_events", "tasks", "effects", "host_lease", "checkpoints", "messages"} <= tables


def test_the_scanner_sees_the_sql_the_control_plane_used_to_hold() -> None:
    """The scan below can fail: it finds each form of runtime SQL the control plane held before issue 36."""
    tables = runtime_tables_from_migrations()
    source = '''
sql.SQL("SELECT max(at) FROM {}.host_events WHERE kind = %s")
sql.SQL("SELECT (SELECT count(*) FROM {s}.tasks WHERE status IN ('pending', 'running')),"
        " (SELECT max(created_at) FROM {s}.messages)")
conn.execute("SELECT to_regclass(quote_ident(%s) || '.host_lease')", (schema,))
conn.execute("select id from checkpoints where created_at < %s")
sql.SQL("SELECT 1 FROM {}").format(sql.Identifier(schema, "step_events"))
"""Docstrings and messages may say tasks, effects and messages in English."""
'''
    assert {t for _line, t in sql_naming(source, tables)} == {"host_events", "tasks", "messages", "host_lease",
                                                            "checkpoints", "step_events"}


def test_only_the_runtime_tables_reader_holds_sql_on_the_runtimes_tables() -> None:
    tables = runtime_tables_from_migrations()
    offenders = []
    for package in control_plane_packages():
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == READER:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}: {table}"
                          for line, table in sorted(set(sql_naming(path.read_text(), tables)))]
    assert offenders == [], ("SQL on the runtime's tables belongs in provisioning/resources/runtime_tables.py, the "
                             "control plane's one reader of them:\n" + "\n".join(offenders))
    assert sql_naming(READER.read_text(), tables), "the reader itself must be visible to the scan"


# --- every reader function, against the runtime's latest schema ------------------------------------------------

AT = datetime(2026, 1, 1, tzinfo=UTC)

# One call per public function of the reader: a function added there without a case here fails the test below.
CASES: dict[str, Callable[[psycopg.Connection[Any], str], object]] = {
    "activity": lambda c, s: runtime_tables.activity(c, s),
    "boot_count": lambda c, s: runtime_tables.boot_count(c, s),
    "boots_since": lambda c, s: (runtime_tables.boots_since(c, s, None), runtime_tables.boots_since(c, s, AT)),
    "checkpoint_before": lambda c, s: runtime_tables.checkpoint_before(c, s, AT),
    "effects_in_trouble_since": lambda c, s: runtime_tables.effects_in_trouble_since(
        c, s, AT, in_doubt_after=timedelta(seconds=30)),
    "first_step_start_since": lambda c, s: runtime_tables.first_step_start_since(c, s, AT),
    "last_event_at": lambda c, s: runtime_tables.last_event_at(c, s, "boot"),
    "latest_boots": lambda c, s: runtime_tables.latest_boots(c, s),
    "lease_expire_now": lambda c, s: runtime_tables.lease_expire_now(c, s),
    "replies_since": lambda c, s: runtime_tables.replies_since(c, s, AT, overlap=timedelta(seconds=60)),
    "release_crossings_since": lambda c, s: runtime_tables.release_crossings_since(c, s, AT),
    "restarts_since": lambda c, s: runtime_tables.restarts_since(c, s, AT),
    "schema_bytes": lambda c, s: runtime_tables.schema_bytes(c, s),
    "steps_done_around": lambda c, s: runtime_tables.steps_done_around(c, s, AT),
    "steps_in_flight": lambda c, s: (runtime_tables.steps_in_flight(c, s, boot_at=AT, previous_boot=None),
                                     runtime_tables.steps_in_flight(c, s, boot_at=AT, previous_boot=AT)),
    "task_counts": lambda c, s: runtime_tables.task_counts(c, s),
    "task_outcomes_since": lambda c, s: runtime_tables.task_outcomes_since(c, s, AT, overlap=timedelta(seconds=60)),
    "task_problems_since": lambda c, s: runtime_tables.task_problems_since(c, s, AT),
    "usage_by_day": lambda c, s: runtime_tables.usage_by_day(c, s, AT.date(), (AT + timedelta(days=2)).date()),
}


def test_every_reader_function_has_a_case() -> None:
    public = {name for name in runtime_tables.__all__ if inspect.isfunction(getattr(runtime_tables, name))}
    assert public == set(CASES)


@pytest.fixture(scope="module")
def migrated() -> Iterator[TenantDB]:
    """A throw-away database and tenant schema, migrated by the runtime as its host does at boot."""
    admin = admin_dsn()
    tenant = create_tenant_db(admin, prefix="rtc")
    try:
        with connect(tenant.dsn, tenant.schema, autocommit=True) as conn:
            assert migrate(conn, tenant.schema) == LATEST_VERSION
        yield tenant
    finally:
        drop_tenant_db(tenant, admin)


@pytest.fixture
def admin(migrated: TenantDB) -> Iterator[psycopg.Connection[Any]]:
    """The superuser, as the control plane reads a tenant's schema (``tenant_admin_connect``)."""
    with psycopg.connect(migrated.admin_dsn, autocommit=True) as conn:
        yield conn


@pytest.mark.parametrize("name", sorted(CASES))
def test_reader_runs_against_the_runtimes_latest_schema(name: str, admin: psycopg.Connection[Any],
                                                         migrated: TenantDB) -> None:
    CASES[name](admin, migrated.schema)


def test_a_renamed_column_breaks_the_contract(admin: psycopg.Connection[Any], migrated: TenantDB) -> None:
    """What the test above guards against: a runtime migration renaming a column the control plane reads."""
    table = f"{migrated.schema}.host_events"
    admin.execute(f"ALTER TABLE {table} RENAME COLUMN at TO happened_at")  # noqa: S608 - test-made names
    try:
        broken = []
        for name, case in CASES.items():
            try:
                case(admin, migrated.schema)
            except psycopg.errors.UndefinedColumn:
                broken.append(name)
    finally:
        admin.execute(f"ALTER TABLE {table} RENAME COLUMN happened_at TO at")  # noqa: S608
    assert {"last_event_at", "latest_boots", "boots_since", "restarts_since", "activity"} <= set(broken)
