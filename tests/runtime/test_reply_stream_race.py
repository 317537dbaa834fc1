"""A reply stream never ends without the reply: the interleaving that lost it, forced through the database.

The stream looks at two things each round: the reply and the task's status. If the reply's append and the
step's 'done' both commit between those two reads, a stream that reads the reply first sees no reply and then a
finished task, and ends empty. The test holds the stream's query behind a lock on `tasks` and commits exactly that
interleaving (the reply and 'done' in one transaction) while it waits.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from agent_runtime.db import connect
from agent_runtime.state.memory import MemoryStore

from .conftest import HostRunner, TenantDB
from .test_instance_api import Client, api_env


def _status_read_waiting(admin: psycopg.Connection, schema: str) -> int:
    """Sessions blocked on `tasks` by the stream's own status read (`task_row`), not the worker's queries: a
    worker waiting there instead would let the test pass without the stream ever being between its reads."""
    row = admin.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation JOIN pg_namespace n"
        " ON n.oid = c.relnamespace JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT l.granted"
        " AND c.relname = 'tasks' AND n.nspname = %s AND a.query LIKE 'SELECT %%FROM tasks WHERE id = $1'",
        (schema,),
    ).fetchone()
    return int(row[0]) if row else 0


def test_a_reply_committed_with_done_between_the_streams_reads_is_still_sent(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner) -> None:
    hold = tmp_path / "hold"
    hold.write_text("1")
    env = api_env(tenant_db, tmp_path, AGENT_CONFIG=json.dumps({"chat_hold_file": str(hold)}))
    hosts.start(env)
    hosts.wait_ready(env)
    api = Client(hosts, env)
    mid = str(uuid.uuid4())
    assert api.call("POST", "/v1/threads/race/messages", {"id": mid, "content": "still there"})[0] == 201
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as c:
        deadline = time.monotonic() + 20
        while c.execute("SELECT status FROM tasks WHERE id = %s", (mid,)).fetchone() != ("running",):
            assert time.monotonic() < deadline, "the chat task never started"
            time.sleep(0.05)
    events: list[tuple[str, Any]] = []
    reader = threading.Thread(target=lambda: events.extend(api.events(f"/v1/threads/race/messages/{mid}/reply",
                                                                      timeout=30)))
    reader.start()
    time.sleep(0.5)  # the stream is open and polling; the step holds after its first word
    with psycopg.connect(tenant_db.admin_dsn) as admin:
        admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(tenant_db.schema)))
        admin.execute(sql.SQL("LOCK TABLE {}.tasks IN ACCESS EXCLUSIVE MODE").format(
            sql.Identifier(tenant_db.schema)))
        with psycopg.connect(tenant_db.admin_dsn, autocommit=True) as watcher:
            deadline = time.monotonic() + 10
            while _status_read_waiting(watcher, tenant_db.schema) == 0:
                assert time.monotonic() < deadline, "the stream never came back to the task's status"
                time.sleep(0.02)
        # What the worker's step would commit, both at once, while the stream waits between its two reads.
        MemoryStore(admin, "race").append("assistant", "echo: still there",
                                          {"task": mid, "turn": "answer", "reply_to": mid})
        admin.execute("UPDATE tasks SET status = 'done', updated_at = clock_timestamp() WHERE id = %s", (mid,))
        admin.commit()
    reader.join(timeout=30)
    hold.unlink()
    kinds = [e for e, _ in events]
    assert kinds[-2:] == ["reply", "end"], events
    assert events[-2][1]["content"] == "echo: still there"
