"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against TenantCheckpointer on a real
tenant schema: every base capability and the extended ones (prune, delete_for_runs, copy_thread) must be
detected and pass; plus what the suite does not check -- large values in the object store, integrity on read."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from agent_runtime.errors import CorruptState
from agent_runtime.integrations.langgraph import TenantCheckpointer
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore


def _objects(tmp_path: Path) -> EncryptedObjectStore:
    tenant = str(uuid.uuid4())
    return EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), tenant)


def test_conformance_suite_passes_every_capability(conn: psycopg.Connection, tmp_path: Path) -> None:
    objects = _objects(tmp_path)

    @checkpointer_test(name="TenantCheckpointer")
    async def factory() -> AsyncIterator[TenantCheckpointer]:
        # A tiny object-store threshold so the suite's values also travel through the encrypted object store.
        yield TenantCheckpointer(conn, objects=objects, large_value_bytes=8)

    # On a thread of its own: in a full run the browser tests' session-scoped Playwright keeps an event loop
    # running on the main thread, and asyncio.run refuses to start inside one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        report = pool.submit(asyncio.run, validate(factory)).result()
    results = report.results
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    failed = {cap: r.failures for cap, r in results.items() if not (r.detected and r.passed)}
    assert not failed, failed
    passed = sum(r.tests_passed for r in results.values())
    assert passed >= 80, passed  # 8 capabilities, 81 tests in langgraph-checkpoint-conformance 0.0.2
    assert objects.list("langgraph/"), "no value went to the object store"


def _put_two(saver: TenantCheckpointer, thread: str) -> dict:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

    cp = generate_checkpoint(channel_values={"messages": ["a", "b"]}, channel_versions={"messages": "1"})
    first = saver.put(generate_config(thread), cp, generate_metadata(step=0), {"messages": "1"})
    cp2 = generate_checkpoint(channel_values={"messages": ["a", "b", "c"]}, channel_versions={"messages": "2"})
    return saver.put(first, cp2, generate_metadata(step=1), {"messages": "2"})


def test_list_values_are_stored_as_deltas_and_read_back_whole(conn: psycopg.Connection) -> None:
    saver = TenantCheckpointer(conn)
    cfg = _put_two(saver, "t-delta")
    rows = conn.execute("SELECT version, base_version, prefix_len FROM lg_blobs WHERE thread_id = 't-delta'"
                        " ORDER BY version").fetchall()
    assert rows == [("1", None, None), ("2", "1", 2)]
    fresh = TenantCheckpointer(conn)  # no cache: rebuilt from the rows
    tup = fresh.get_tuple(cfg)
    assert tup is not None and tup.checkpoint["channel_values"] == {"messages": ["a", "b", "c"]}


@pytest.mark.parametrize("table", ["lg_blobs", "lg_checkpoints"])
def test_an_edited_row_fails_its_checksum_on_read(conn: psycopg.Connection, table: str) -> None:
    cfg = _put_two(TenantCheckpointer(conn), "t-tamper")
    column = "data" if table == "lg_blobs" else "metadata"
    value = "'\\x00'::bytea" if table == "lg_blobs" else "'{\"step\": 7}'::jsonb"
    conn.execute(f"UPDATE {table} SET {column} = {value} WHERE thread_id = 't-tamper'")
    with pytest.raises(CorruptState):
        TenantCheckpointer(conn).get_tuple(cfg)
