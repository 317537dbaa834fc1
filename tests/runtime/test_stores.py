"""Migrations, conversation memory, checkpoints, tool cache, object store and workspace, on real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from agent_runtime.errors import ConfigError, CorruptState, ObjectKeyRefused, SchemaTooNew, SnapshotMissing
from agent_runtime.state import tasks
from agent_runtime.state.checkpoints import CaseDelta, CheckpointStore
from agent_runtime.state.memory import MemoryStore
from agent_runtime.state.migrations import LATEST_VERSION, current_version, migrate, schemas_needing_migration
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore, objectstore_from_url
from agent_runtime.state.records import record_object
from agent_runtime.state.toolcache import ToolCache
from agent_runtime.state.workspace import EMPTY_DIGEST, restore_snapshot, snapshot, tree_digest

from .conftest import ROOT, TenantDB


# --- migrations -------------------------------------------------------------------------------
def test_migrate_idempotent_concurrent_and_owned_by_tenant(tenant_db: TenantDB) -> None:
    with psycopg.connect(tenant_db.admin_dsn, autocommit=True) as admin:
        assert current_version(admin, tenant_db.schema) is None
        results: list[int] = []

        def run() -> None:
            with psycopg.connect(tenant_db.admin_dsn) as c:
                results.append(migrate(c, tenant_db.schema))

        threads = [threading.Thread(target=run) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert results == [LATEST_VERSION] * 4
        assert migrate(admin, tenant_db.schema) == LATEST_VERSION
        assert current_version(admin, tenant_db.schema) == LATEST_VERSION
        owners = {r[0] for r in admin.execute(
            "SELECT tableowner FROM pg_tables WHERE schemaname = %s", (tenant_db.schema,))}
        assert owners == {tenant_db.role}
        admin.execute(sql.SQL("INSERT INTO {}.agent_schema_version (version) VALUES (%s)").format(
            sql.Identifier(tenant_db.schema)), (LATEST_VERSION + 1,))
        with pytest.raises(SchemaTooNew):
            migrate(admin, tenant_db.schema)


def test_schemas_needing_migration_1000_in_one_query(tenant_db: TenantDB) -> None:
    names = [f"s_{i:04d}_{uuid.uuid4().hex[:6]}" for i in range(1000)]
    with psycopg.connect(tenant_db.admin_dsn, autocommit=True) as admin:
        with admin.transaction():
            for n in names:
                admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                    sql.Identifier(n), sql.Identifier(tenant_db.role)))
        for n in names[:5]:
            migrate(admin, n)
        t0 = time.perf_counter()
        needing = schemas_needing_migration(admin, names + ["no_such_schema"])
        elapsed = time.perf_counter() - t0
    assert needing == names[5:] + ["no_such_schema"]
    assert elapsed < 5.0, elapsed


# --- memory -----------------------------------------------------------------------------------
def test_message_log_reads_and_facts(conn: psycopg.Connection) -> None:
    mem = MemoryStore(conn)
    seqs = [mem.append("user" if i % 2 == 0 else "assistant", f"message {i}", {"i": i}) for i in range(10)]
    assert [m.content for m in mem.tail(3)] == ["message 7", "message 8", "message 9"]
    assert [m.seq for m in mem.since(seqs[7])] == seqs[8:]
    assert [m.metadata["i"] for m in mem.range(seqs[2], seqs[4])] == [2, 3, 4]
    assert mem.set_fact("lang", "fr") == 1 and mem.set_fact("lang", "de") == 2
    assert mem.get_fact("lang").value == "de"
    assert [f.value for f in mem.fact_history("lang")] == ["fr", "de"]
    mem.delete_fact("lang")
    assert mem.get_fact("lang") is None


def test_context_overflow_window_is_bounded_and_rollover_keeps_log(conn: psycopg.Connection) -> None:
    mem = MemoryStore(conn)
    with conn.transaction():
        mem.append_many([("user", "x" * 400, {}) for _ in range(5000)])  # ~500k tokens, budget 2k
    win = mem.window(2000)
    assert win.needs_rollover and win.tokens <= 2000
    assert win.rows_scanned <= 64 * 2  # read from the tail, not the whole log
    assert win.messages[-1].seq == mem.last_seq()
    summary = mem.rollover(2000, lambda prev, chunk: f"summary up to {chunk[-1].seq}")
    assert summary is not None and summary.upto_seq > win.dropped_seqs[1]
    win2 = mem.window(2000)
    assert win2.summary and win2.summary.id == summary.id and not win2.needs_rollover
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == 5000  # never rewritten


def test_corrupt_message_row_is_a_clear_error(conn: psycopg.Connection) -> None:
    mem = MemoryStore(conn)
    seq = mem.append("user", "pay 10 EUR to alice")
    conn.execute("UPDATE messages SET content = left(content, 5) WHERE seq = %s", (seq,))  # truncated
    with pytest.raises(CorruptState, match=f"seq={seq}"):
        mem.window(1000)


# --- checkpoints ------------------------------------------------------------------------------
def test_checkpoints_deltas_retention_and_constant_row_size(conn: psycopg.Connection) -> None:
    store = CheckpointStore(conn, keep_latest=5)
    tid = tasks.submit(conn, "demo", {})
    for i in range(1, 301):
        with conn.transaction():
            store.commit(tid, f"s{i}", CaseDelta(done={f"s{i}": i}, waiting={"w": i if i < 300 else None},
                                                 ruled_out={"r": "x"} if i == 3 else {}),
                         workspace_digest=EMPTY_DIGEST, ledger_pos=0)
    seqs = [cp.seq for cp in store.list(tid)]
    assert seqs[-5:] == [296, 297, 298, 299, 300]
    assert set(seqs[:-5]) <= {s for s in range(1, 301) if s % 10 == 0}
    assert len(seqs) < 30
    case = store.case_file(store.latest(tid))
    assert len(case.steps_done) == 300 and case.waiting_on == {} and case.ruled_out == {"r": "x"}
    sizes = [r[0] for r in conn.execute(
        "SELECT pg_column_size(c.*) FROM checkpoints c WHERE task_id = %s ORDER BY seq", (tid,))]
    assert max(sizes) - min(sizes) <= 8  # O(step), not O(history)


def test_corrupt_or_newer_checkpoint_refused(conn: psycopg.Connection) -> None:
    store = CheckpointStore(conn)
    tid = tasks.submit(conn, "demo", {})
    store.commit(tid, "plan", CaseDelta(done={"plan": 1}), workspace_digest=EMPTY_DIGEST, ledger_pos=0)
    conn.execute("UPDATE case_entries SET value = '2' WHERE task_id = %s", (tid,))
    with pytest.raises(CorruptState):
        store.case_file(store.latest(tid))
    conn.execute("UPDATE checkpoints SET ledger_pos = 7 WHERE task_id = %s", (tid,))
    with pytest.raises(CorruptState):
        store.latest(tid)
    tid2 = tasks.submit(conn, "demo", {})
    cp = store.commit(tid2, "plan", CaseDelta(), workspace_digest=EMPTY_DIGEST, ledger_pos=0)
    # A row written by a future runtime (format version + matching checksum).
    from agent_runtime.state.checkpoints import _cp_checksum

    conn.execute("UPDATE checkpoints SET format_version = %s, checksum = %s WHERE id = %s",
                 (LATEST_VERSION + 1, _cp_checksum(tid2, 1, 0, "plan", "step", LATEST_VERSION + 1, EMPTY_DIGEST,
                                                   0, None), cp.id))
    with pytest.raises(SchemaTooNew, match="refusing to resume"):
        store.latest(tid2)


# --- object store, encryption, tool cache ------------------------------------------------------
def test_object_store_keys_encryption_and_factory(tmp_path: Path) -> None:
    raw = objectstore_from_url(f"file://{tmp_path}/tenants/a/")
    for bad in ("../b/x", "/etc/passwd", "a/../../x", "", "a//b"):
        with pytest.raises(ObjectKeyRefused):
            raw.put(bad, b"x")
    with pytest.raises(ConfigError, match="unsupported object-store URL scheme"):
        objectstore_from_url("gopher://x/")
    key_a, key_b = os.urandom(32), os.urandom(32)
    a = EncryptedObjectStore(raw, key_a, "tenant-a")
    a.put("notes/1", b"secret plan")
    assert b"secret plan" not in (tmp_path / "tenants/a/notes/1").read_bytes()
    assert a.get("notes/1") == b"secret plan"
    with pytest.raises(CorruptState):
        EncryptedObjectStore(raw, key_b, "tenant-b").get("notes/1")  # another tenant's key
    raw.put("notes/2", raw.get("notes/1"))  # moved blob: AAD binds the key name
    with pytest.raises(CorruptState):
        a.get("notes/2")
    with pytest.raises(SnapshotMissing):
        a.get("notes/none")
    assert raw.list("notes/") == ["notes/1", "notes/2"]


def test_a_link_planted_below_the_root_is_never_followed(tmp_path: Path) -> None:
    """Whoever can write below a tenant's root can plant a symbolic link there; no key reaches through one, to a
    directory or a file, in or out of the root, for reading or for any kind of write."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret").write_bytes(b"another tenant's object")
    raw = FileObjectStore(tmp_path / "tenants" / "a")
    raw.put("ledger/real", record_object([b"r"]))
    (tmp_path / "tenants/a/notes").symlink_to(outside, target_is_directory=True)
    (tmp_path / "tenants/a/ledger/link").symlink_to(outside / "secret")
    (tmp_path / "tenants/a/ledger/inside").symlink_to(tmp_path / "tenants/a/ledger/real")
    for key in ("notes/secret", "ledger/link", "ledger/inside", "notes/new"):
        with pytest.raises(ObjectKeyRefused, match="symbolic link"):
            raw.get(key)
        with pytest.raises(ObjectKeyRefused):
            raw.put(key, b"x")
        with pytest.raises(ObjectKeyRefused):
            raw.append(key, b"x")
        with pytest.raises(ObjectKeyRefused):
            raw.create(key, b"x")
        with pytest.raises(ObjectKeyRefused):
            raw.delete(key)
    assert (outside / "secret").read_bytes() == b"another tenant's object"
    assert os.listdir(outside) == ["secret"]
    assert raw.records("ledger/real") == [b"r"]
    assert raw.create("deep/new/one", b"x") and raw.records("deep/new/one") == [b"x"]


def test_tool_cache_inline_large_and_ttl(conn: psycopg.Connection, tmp_path: Path) -> None:
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "o"), os.urandom(32), "t")
    cache = ToolCache(conn, store, inline_max=100, ttl_s={"fast": 0.2})
    calls: list[str] = []

    def tool(tag: str, size: int) -> dict:
        calls.append(tag)
        return {"tag": tag, "blob": "y" * size}

    assert cache.cached("search", {"q": 1}, lambda: tool("small", 10), scope="kind:t")["tag"] == "small"
    assert cache.cached("search", {"q": 1}, lambda: tool("again", 10), scope="kind:t")["tag"] == "small"
    big = cache.cached("search", {"q": 2}, lambda: tool("big", 5000), scope="kind:t")
    assert cache.cached("search", {"q": 2}, lambda: tool("big2", 5000), scope="kind:t") == big
    row = conn.execute("SELECT inline_value, object_key FROM tool_cache WHERE size > 1000").fetchone()
    assert row[0] is None and row[1].startswith("cas/") and store.exists(row[1])
    assert b"yyyy" not in (tmp_path / "o" / row[1]).read_bytes()
    cache.cached("fast", {}, lambda: tool("f1", 1), scope="kind:t")
    time.sleep(0.3)
    cache.cached("fast", {}, lambda: tool("f2", 1), scope="kind:t")
    assert calls == ["small", "big", "f1", "f2"]


# --- workspace --------------------------------------------------------------------------------
def test_workspace_digest_snapshot_restore_and_missing(conn: psycopg.Connection, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("alpha")
    (ws / "sub" / "b.sh").write_text("echo hi")
    d1 = tree_digest(ws)
    assert d1 == tree_digest(ws) != EMPTY_DIGEST
    (ws / "sub" / "b.sh").chmod(0o755)
    d2 = tree_digest(ws)
    assert d2 != d1  # modes count
    store = EncryptedObjectStore(FileObjectStore(tmp_path / "o"), os.urandom(32), "t")
    key, digest = snapshot(conn, store, ws, "test")
    assert digest == d2
    (ws / "a.txt").write_text("tampered")
    (ws / "new").write_text("x")
    restore_snapshot(store, key, ws, digest)
    assert tree_digest(ws) == d2 and (ws / "a.txt").read_text() == "alpha"
    (ws / "a.txt").write_text("current work")
    before = tree_digest(ws)
    store.delete(key)
    with pytest.raises(SnapshotMissing, match="missing"):
        restore_snapshot(store, key, ws, digest)
    assert tree_digest(ws) == before  # untouched
    store.put(key, b"not a tarball")
    with pytest.raises(CorruptState):
        restore_snapshot(store, key, ws, digest)
    assert tree_digest(ws) == before


def test_an_object_put_survives_a_power_loss_its_rename_and_new_directory_are_fsynced(tmp_path: Path) -> None:
    """The journal's durability, read off the system calls a real put makes (strace): the data is fsynced
    before the rename, and after it the directory holding the new entry, and the parent of a directory the put
    created. Without the directory fsyncs a power loss can undo the rename though the data reached the disk."""
    root = tmp_path / "objects"
    script = ("import sys; from pathlib import Path; from agent_runtime.state.objectstore import FileObjectStore;"
              " FileObjectStore(Path(sys.argv[1])).put('ledger/eff-1', b'committed')")
    trace = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-e", "trace=openat,fsync,rename,renameat,renameat2", "-o", str(trace),
                    sys.executable, "-c", script, str(root)], check=True, timeout=60, cwd=ROOT)
    calls = [line.split(None, 1)[1] for line in trace.read_text().splitlines() if str(root) in line
             or "fsync(" in line]
    calls = calls[next(i for i, c in enumerate(calls) if str(root) in c):]  # from the store's first call on
    fds: dict[str, str] = {}  # fd -> what it was opened on
    events = []
    for call in calls:
        if call.startswith("openat(") and "= " in call:
            fds[call.rsplit("= ", 1)[1].strip()] = call.split('"')[1]
        elif call.startswith("fsync("):
            events.append(("fsync", fds[call[6:call.index(")")]]))
        elif call.startswith("rename"):
            events.append(("rename", call.split('"')[3]))
    target = str(root / "ledger" / "eff-1")
    renamed = events.index(("rename", target))
    assert events[renamed - 1][0] == "fsync" and ".tmp-" in events[renamed - 1][1]  # data before the rename
    after = events[renamed + 1:]
    assert ("fsync", str(root / "ledger")) in after  # the entry the rename made
    assert ("fsync", str(root)) in after  # the entry of the directory this put created
