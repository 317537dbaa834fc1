"""Versioned SQL migrations applied into one tenant schema, with a version table.

`migrate` is idempotent and safe when two processes run it at once (transaction-scoped advisory lock
keyed on the schema). Run by the control plane with a superuser it switches to the schema's owner role so
the tables stay owned by the tenant. The current version is also kept in the version table's COMMENT so
`schemas_needing_migration` can check any number of schemas in one catalog query.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg import sql

from agent_runtime.db import check_schema_name, lock_key
from agent_runtime.errors import SchemaTooNew
from agent_runtime.state.fence import ensure_fences
from agent_runtime.state.rowchecks import effect_checksum, fact_checksum, judgment_checksum, summary_checksum

__all__ = ["LATEST_VERSION", "MIGRATIONS", "current_version", "migrate", "schemas_needing_migration"]

VERSION_TABLE = "agent_schema_version"

MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE messages (
    seq bigserial PRIMARY KEY,
    thread text NOT NULL DEFAULT 'main',
    role text NOT NULL,
    content text NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    tokens integer NOT NULL,
    checksum text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX messages_thread_seq ON messages (thread, seq);
CREATE TABLE summaries (
    id bigserial PRIMARY KEY,
    thread text NOT NULL DEFAULT 'main',
    upto_seq bigint NOT NULL,
    content text NOT NULL,
    tokens integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX summaries_thread_upto ON summaries (thread, upto_seq);
CREATE TABLE facts (
    key text NOT NULL,
    version integer NOT NULL,
    value jsonb,
    deleted boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (key, version)
);
CREATE TABLE tasks (
    id uuid PRIMARY KEY,
    kind text NOT NULL,
    params jsonb NOT NULL DEFAULT '{}'::jsonb,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'blocked', 'done', 'failed')),
    branch integer NOT NULL DEFAULT 0,
    blocked_reason text,
    blocked_detail text,
    progress_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX tasks_unfinished ON tasks (created_at) WHERE status IN ('pending', 'running');
CREATE TABLE case_entries (
    id bigserial PRIMARY KEY,
    task_id uuid NOT NULL REFERENCES tasks (id),
    checkpoint_seq integer NOT NULL,
    kind text NOT NULL CHECK (kind IN ('done', 'waiting', 'ruled_out', 'note')),
    key text NOT NULL,
    value jsonb NOT NULL DEFAULT 'null'::jsonb,
    checksum text NOT NULL
);
CREATE INDEX case_entries_task ON case_entries (task_id, checkpoint_seq);
CREATE TABLE checkpoints (
    id bigserial PRIMARY KEY,
    task_id uuid NOT NULL REFERENCES tasks (id),
    seq integer NOT NULL,
    branch integer NOT NULL DEFAULT 0,
    step text NOT NULL,
    kind text NOT NULL DEFAULT 'step' CHECK (kind IN ('step', 'timer', 'fork')),
    format_version integer NOT NULL,
    workspace_digest text NOT NULL,
    ledger_pos bigint NOT NULL,
    snapshot_key text,
    checksum text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (task_id, seq)
);
CREATE TABLE step_events (
    id bigserial PRIMARY KEY,
    task_id uuid NOT NULL,
    step text NOT NULL,
    event text NOT NULL CHECK (event IN ('start', 'done', 'abandoned', 'failed')),
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX step_events_task ON step_events (task_id, id);
CREATE TABLE effects (
    id bigserial PRIMARY KEY,
    task_id uuid NOT NULL,
    step text NOT NULL,
    effect text NOT NULL,
    idem_key text NOT NULL UNIQUE,
    args jsonb NOT NULL,
    args_digest text NOT NULL,
    state text NOT NULL CHECK (state IN ('intent', 'committed', 'failed', 'blocked')),
    result jsonb,
    resolution text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    settled_at timestamptz
);
CREATE INDEX effects_open ON effects (id) WHERE state IN ('intent', 'blocked');
CREATE TABLE judgments (
    id bigserial PRIMARY KEY,
    task_id uuid,
    name text NOT NULL,
    artifact text NOT NULL,
    artifact_digest text NOT NULL,
    passed boolean NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX judgments_lookup ON judgments (name, artifact, id);
CREATE TABLE branches (
    id bigserial PRIMARY KEY,
    task_id uuid NOT NULL,
    branch integer NOT NULL,
    from_checkpoint bigint,
    reason text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE tool_cache (
    tool text NOT NULL,
    args_hash text NOT NULL,
    inline_value bytea,
    object_key text,
    size integer NOT NULL,
    content_hash text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz,
    PRIMARY KEY (tool, args_hash)
);
CREATE TABLE embeddings (
    content_hash text NOT NULL,
    model text NOT NULL,
    doc_id text NOT NULL,
    dim integer NOT NULL,
    vec bytea NOT NULL,
    text text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (model, content_hash)
);
CREATE TABLE snapshots (
    id bigserial PRIMARY KEY,
    scope text NOT NULL,
    object_key text NOT NULL,
    digest text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE host_events (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
""",
    # Several effects of one kind per step (ordinal) and author-chosen keys (explicit_key).
    2: """
ALTER TABLE effects ADD COLUMN ordinal integer, ADD COLUMN explicit_key text;
""",
    # Attempts of a step that are not the step's fault: 'waiting' (an effect in doubt, asked again later) and
    # 'abandoned' (our own planned stop) do not count towards poison steps; 'hung' (no progress) does.
    3: """
ALTER TABLE step_events DROP CONSTRAINT step_events_event_check;
ALTER TABLE step_events ADD CONSTRAINT step_events_event_check
    CHECK (event IN ('start', 'done', 'abandoned', 'failed', 'waiting', 'hung'));
""",
    # LangGraph checkpoints (agent_runtime.integrations.langgraph): a small row per checkpoint, channel values
    # once per (channel, version) -- list values as a delta on the version they extend --, pending writes.
    4: """
CREATE TABLE lg_checkpoints (
    thread_id text NOT NULL,
    checkpoint_ns text NOT NULL DEFAULT '',
    checkpoint_id text NOT NULL,
    parent_checkpoint_id text,
    run_id text,
    body_type text NOT NULL,
    body bytea NOT NULL,
    versions jsonb NOT NULL,
    metadata jsonb NOT NULL,
    checksum text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX lg_checkpoints_run ON lg_checkpoints (run_id) WHERE run_id IS NOT NULL;
CREATE TABLE lg_blobs (
    thread_id text NOT NULL,
    checkpoint_ns text NOT NULL,
    channel text NOT NULL,
    version text NOT NULL,
    type text NOT NULL,
    base_version text,
    prefix_len integer,
    data bytea,
    object_key text,
    size integer NOT NULL,
    checksum text NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);
CREATE TABLE lg_writes (
    thread_id text NOT NULL,
    checkpoint_ns text NOT NULL,
    checkpoint_id text NOT NULL,
    task_id text NOT NULL,
    idx integer NOT NULL,
    task_path text NOT NULL DEFAULT '',
    channel text NOT NULL,
    type text NOT NULL,
    data bytea NOT NULL,
    checksum text NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
""",
    # Cached tool outputs remember the credential (name, version) they were fetched under (`ctx.tool(...,
    # credential=)`): after a revocation or a new version they are not served again.
    5: """
ALTER TABLE tool_cache ADD COLUMN credential text, ADD COLUMN credential_version integer;
""",
    # Checksums on the rows that had none (`state.rowchecks`); existing rows are backfilled by `_backfill_6`.
    6: """
ALTER TABLE summaries ADD COLUMN checksum text;
ALTER TABLE facts ADD COLUMN checksum text;
ALTER TABLE judgments ADD COLUMN checksum text;
ALTER TABLE effects ADD COLUMN checksum text;
""",
    # The fenced single writer (`state.fence`): the lease and the trigger function every table calls.
    7: """
CREATE TABLE host_lease (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    generation bigint NOT NULL,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE FUNCTION agent_fence() RETURNS trigger LANGUAGE plpgsql AS $fence$
DECLARE
    app text := coalesce(current_setting('application_name', true), '');
BEGIN
    IF app LIKE 'agent-host:%' THEN
        PERFORM 1 FROM host_lease WHERE holder = substr(app, 12) FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'agent_runtime: host % no longer holds the single-writer lease', substr(app, 12)
                USING ERRCODE = 'AR001';
        END IF;
    END IF;
    RETURN NULL;
END
$fence$;
""",
    # Effect rows count their changes (`effects.journal`): the newer of table and journal wins.
    8: """
ALTER TABLE effects ADD COLUMN revision integer NOT NULL DEFAULT 1;
""",
    # The instance API: tasks can be cancelled; a thread's messages are listed by (thread, seq) already; a reply
    # is found by the task that wrote it (conversation turns carry their task id in the metadata).
    9: """
ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('pending', 'running', 'blocked', 'done', 'failed', 'cancelled'));
CREATE INDEX tasks_created ON tasks (created_at DESC, id DESC);
CREATE INDEX messages_task ON messages ((metadata->>'task')) WHERE metadata ? 'task';
""",
    # Semantic memory (`state.semantic`): one table per embedding model, created by the index code with the
    # layout the server allows (pgvector or float32 bytes), so it is not in this versioned DDL; this registry
    # says which table and layout each model has, which model is active and how far a re-embedding got.
    # Rows of the old `embeddings` table move into their model's table on its first use.
    10: """
CREATE TABLE semantic_models (
    model text PRIMARY KEY,
    table_name text NOT NULL UNIQUE,
    dim integer NOT NULL CHECK (dim > 0),
    layout text NOT NULL CHECK (layout IN ('pgvector', 'bytea')),
    state text NOT NULL CHECK (state IN ('active', 'filling')),
    fill_from text,
    fill_cursor text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    active_since timestamptz
);
""",
    # When the effect was last attempted: a lookup whose provider indexes with a delay is trusted to say
    # "absent" only once its consistency window has passed since then. Rows from before get the migration's
    # time (the window then counts from the upgrade: never earlier than the truth).
    11: """
ALTER TABLE effects ADD COLUMN attempted_at timestamptz NOT NULL DEFAULT clock_timestamp();
""",
    # The agent configuration a task runs with (ctx.config), recorded before its first step: a replay keeps the
    # values it started with. NULL: not started yet (or started before this version: it gets the current one).
    12: """
ALTER TABLE tasks ADD COLUMN agent_config jsonb;
""",
    # Levers on a stuck task: a step's error (type, message and the agent's own file:line) is kept with its
    # 'failed' event; 'retried' marks an operator's retry (attempts before it no longer count towards a poison
    # step); a task blocked on a missing credential names it, so the host can resume it once the vault has it.
    13: """
ALTER TABLE step_events ADD COLUMN error text;
ALTER TABLE step_events DROP CONSTRAINT step_events_event_check;
ALTER TABLE step_events ADD CONSTRAINT step_events_event_check
    CHECK (event IN ('start', 'done', 'abandoned', 'failed', 'waiting', 'hung', 'retried'));
ALTER TABLE tasks ADD COLUMN blocked_credential text;
CREATE INDEX tasks_blocked_credential ON tasks (blocked_credential) WHERE blocked_credential IS NOT NULL;
""",
    # Tool outputs are scoped (`state.toolcache`): `kind:<agent kind>` by default, `shared` when the author says
    # so. Rows from before get `legacy`, a scope no lookup asks for: one kind's cached order is never served to
    # another kind, and the old rows age out by their TTL instead of being guessed into a scope.
    14: """
ALTER TABLE tool_cache ADD COLUMN scope text NOT NULL DEFAULT 'legacy';
ALTER TABLE tool_cache ALTER COLUMN scope DROP DEFAULT;
ALTER TABLE tool_cache DROP CONSTRAINT tool_cache_pkey;
ALTER TABLE tool_cache ADD PRIMARY KEY (scope, tool, args_hash);
""",
    # The version policy per task (`host.release_policy`): the release a task started on ({version, digest};
    # empty strings: the runtime's own agents), recorded before its first step so it finishes there. A task
    # that continues on another release (the agent declares its steps compatible, or an operator retries it)
    # gets a 'release_crossed' event naming both, which a rollout's health gate counts.
    15: """
ALTER TABLE tasks ADD COLUMN release jsonb;
ALTER TABLE step_events DROP CONSTRAINT step_events_event_check;
ALTER TABLE step_events ADD CONSTRAINT step_events_event_check
    CHECK (event IN ('start', 'done', 'abandoned', 'failed', 'waiting', 'hung', 'retried', 'release_crossed'));
""",
    # Thread policies (docs/conversations.md): a message with `interrupt` ends the thread's running task at its
    # next step boundary as 'interrupted' (what it committed stays); `rollback` ends it as 'rolled_back' (allowed
    # only while it has no effect that happened or may have), and the thread's window skips that run's messages,
    # found by the partial index below (the log itself stays append-only).
    16: """
ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('pending', 'running', 'blocked', 'done', 'failed', 'cancelled', 'interrupted', 'rolled_back'));
CREATE INDEX tasks_rolled_back ON tasks (id) WHERE status = 'rolled_back';
""",
    # Model usage (`ctx.usage`, `state.usage`): one row per model call the agent reports, with its token counts,
    # so an operator can bill them. `usage_key` makes a report count once: the provider's id for the call when the
    # author passes it (a replayed cached answer reports the same id), else one the runtime makes per report.
    17: """
CREATE TABLE model_usage (
    id bigserial PRIMARY KEY,
    task_id uuid,
    step text NOT NULL DEFAULT '',
    model text NOT NULL,
    input_tokens bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens bigint NOT NULL CHECK (output_tokens >= 0),
    usage_key text NOT NULL UNIQUE,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX model_usage_at ON model_usage (at);
""",
    # Traces (`state.traces`, docs/observability.md): the OpenTelemetry spans of each task's runs, kept here so the
    # product shows a waterfall without a collector. Bounded: at most AGENT_TRACE_SPANS_PER_TASK per task, and
    # rows older than AGENT_TRACE_KEEP_DAYS are pruned after task runs. Attributes are already redacted.
    18: """
CREATE TABLE trace_spans (
    id bigserial PRIMARY KEY,
    task_id uuid NOT NULL,
    trace_id text NOT NULL,
    span_id text NOT NULL,
    parent_span_id text,
    name text NOT NULL,
    kind text NOT NULL,
    status text NOT NULL DEFAULT 'unset',
    started_at timestamptz NOT NULL,
    duration_ms double precision NOT NULL CHECK (duration_ms >= 0),
    attributes jsonb NOT NULL DEFAULT '{}',
    UNIQUE (trace_id, span_id)
);
CREATE INDEX trace_spans_task ON trace_spans (task_id, started_at);
CREATE INDEX trace_spans_started ON trace_spans (started_at);
""",
    # The channel task notifications go on (`tasks.notify_channel`): PostgreSQL has no permissions on LISTEN and
    # tenants' schemas may share a database, so a name any role could know or derive (the former `agent_tasks`)
    # told every tenant each other's submits and woke every host of the database. A random name (122 bits from
    # the server's strong random source) kept here is readable by this schema's role alone (no USAGE for PUBLIC).
    19: """
CREATE TABLE task_channel (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    name text NOT NULL CHECK (name ~ '^agent_tasks_[0-9a-f]{32}$')
);
INSERT INTO task_channel (name) VALUES ('agent_tasks_' || replace(gen_random_uuid()::text, '-', ''));
""",
    # A graph checkpoint's keyframe (a whole message history, ~0.5 MB at 2,000 messages) is compressed by the
    # server on insert and decompressed on every cold read: with lz4 instead of the default pglz, inserting one took
    # 0.4 ms instead of 3.0 ms and reading it 0.23 instead of 0.31, for 2 % more bytes stored (docs/benchmarks.md,
    # issue 39). Rows already written keep pglz (both read back the same). A server built without lz4 (or older
    # than 14) keeps pglz: the error is caught, the migration still applies.
    20: """
DO $$
BEGIN
    EXECUTE 'ALTER TABLE lg_blobs ALTER COLUMN data SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'lg_blobs.data keeps pglz: %', SQLERRM;
END
$$;
""",
    # The effects of one task (issue 39): a step's checkpoint reads its task's ledger position (the newest committed
    # effect), the dashboard and the host their effects. Without an index each was a scan of the tenant's whole
    # effect history: at 200,000 effects a one-effect step took 22 ms where it takes 4.
    21: """
CREATE INDEX effects_task ON effects (task_id, id);
""",
}

LATEST_VERSION: int = max(MIGRATIONS)


def _backfill_6(conn: psycopg.Connection) -> None:
    """Checksum the rows written before version 6, then require a checksum on every row from now on."""
    for sid, thread, upto, content in conn.execute("SELECT id, thread, upto_seq, content FROM summaries").fetchall():
        conn.execute("UPDATE summaries SET checksum = %s WHERE id = %s", (summary_checksum(thread, upto, content), sid))
    for key, version, value, deleted in conn.execute("SELECT key, version, value, deleted FROM facts").fetchall():
        conn.execute("UPDATE facts SET checksum = %s WHERE key = %s AND version = %s",
                     (fact_checksum(key, value, deleted), key, version))
    for jid, task, name, artifact, digest, passed, detail in conn.execute(
            "SELECT id, task_id, name, artifact, artifact_digest, passed, detail FROM judgments").fetchall():
        conn.execute("UPDATE judgments SET checksum = %s WHERE id = %s",
                     (judgment_checksum(task, name, artifact, digest, passed, detail), jid))
    for row in conn.execute("SELECT id, idem_key, task_id, step, effect, args_digest, state, result, resolution,"
                            " ordinal, explicit_key FROM effects").fetchall():
        conn.execute("UPDATE effects SET checksum = %s WHERE id = %s", (effect_checksum(*row[1:]), row[0]))
    for table in ("summaries", "facts", "judgments", "effects"):
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN checksum SET NOT NULL").format(sql.Identifier(table)))


# Data migrations that need Python (checksums), run right after the SQL of the same version.
BACKFILLS: dict[int, Callable[[psycopg.Connection], None]] = {6: _backfill_6}


def _version_table_exists(conn: psycopg.Connection, schema: str) -> bool:
    row = conn.execute(
        "SELECT to_regclass(format('%%I.%%I', %s::text, %s::text)) IS NOT NULL", (schema, VERSION_TABLE)
    ).fetchone()
    return bool(row and row[0])


def current_version(conn: psycopg.Connection, schema: str) -> int | None:
    """The highest applied version in `schema`, or None when the runtime never migrated it."""
    check_schema_name(schema)
    if not _version_table_exists(conn, schema):
        return None
    row = conn.execute(
        sql.SQL("SELECT max(version) FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(VERSION_TABLE))
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def migrate(conn: psycopg.Connection, schema: str) -> int:
    """Apply every missing migration to `schema`; return the version now in force.

    Commits its own transaction. Raises SchemaTooNew when the schema is ahead of this runtime.
    """
    check_schema_name(schema)
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.commit()
    prev_autocommit = conn.autocommit
    conn.autocommit = False
    try:
        with conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key("migrate", schema),)
            )
            owner_row = conn.execute(
                "SELECT pg_get_userbyid(nspowner), current_user FROM pg_namespace WHERE nspname = %s",
                (schema,),
            ).fetchone()
            if owner_row is None:
                raise SchemaTooNew(f"schema {schema!r} does not exist")  # pragma: no cover - provisioning bug
            owner, me = owner_row
            if owner != me:
                # A superuser (control plane) migrates as the owner so the tenant role owns its tables.
                conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)))
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(sql.Identifier(VERSION_TABLE))
            )
            row = conn.execute(sql.SQL("SELECT max(version) FROM {}").format(sql.Identifier(VERSION_TABLE))).fetchone()
            have = int(row[0]) if row and row[0] is not None else 0
            if have > LATEST_VERSION:
                raise SchemaTooNew(
                    f"schema {schema!r} is at version {have}, this runtime knows up to {LATEST_VERSION}; "
                    "refusing to run against a newer schema"
                )
            for version in sorted(v for v in MIGRATIONS if v > have):
                conn.execute(MIGRATIONS[version])
                if version in BACKFILLS:
                    BACKFILLS[version](conn)
                conn.execute(
                    sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(sql.Identifier(VERSION_TABLE)),
                    (version,),
                )
                have = version
            if have >= 7:
                ensure_fences(conn, schema)
            conn.execute(
                sql.SQL("COMMENT ON TABLE {} IS {}").format(
                    sql.Identifier(VERSION_TABLE), sql.Literal(f"agent_runtime:version={have}")
                )
            )
        return have
    finally:
        conn.autocommit = prev_autocommit


def schemas_needing_migration(conn: psycopg.Connection, schemas: list[str]) -> list[str]:
    """Of `schemas`, those below LATEST_VERSION (or never migrated), in one catalog query."""
    rows = conn.execute(
        """
        SELECT s.name
        FROM unnest(%s::text[]) WITH ORDINALITY AS s(name, ord)
        LEFT JOIN pg_namespace n ON n.nspname = s.name
        LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = %s AND c.relkind = 'r'
        WHERE coalesce(
            substring(obj_description(c.oid, 'pg_class') FROM 'agent_runtime:version=([0-9]+)')::int, 0
        ) < %s
        ORDER BY s.ord
        """,
        (list(schemas), VERSION_TABLE, LATEST_VERSION),
    ).fetchall()
    return [r[0] for r in rows]
