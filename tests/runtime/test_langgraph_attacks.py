"""The rollback attacks on LangGraph, both ways on the same tenant database.

Payment: a graph whose tool charges the payments peer (de-duplication off: a provider that ignores keys) is
resumed from the checkpoint taken before the payment (LangGraph time travel). With PostgresSaver and a plain
tool the provider is charged twice -- the anchor's behaviour, asserted so this stays honest; with
TenantCheckpointer and `effect()` once, and the replay returns the recorded charge.

Scan then release: the scan's verdict is in the graph state; the workspace is restored from an older snapshot
(an infected file) and the graph resumed before 'release'. With PostgresSaver the state's verdict releases
files it never checked; with ours `require_judgment` finds no verdict bound to these files and refuses.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg import sql
from psycopg.rows import dict_row

from agent_runtime.errors import JudgmentInvalid
from agent_runtime.integrations.langgraph import TenantCheckpointer, effect, judge, require_judgment
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore
from agent_runtime.state.workspace import restore_snapshot, snapshot, tree_digest
from scripts.crashkit.graphs import payment_graph
from tests.runtime.conftest import Sinks, TenantDB, payment_adapter


def _time_travel_before(graph: Any, config: dict[str, Any], node: str) -> dict[str, Any]:
    """The config of the checkpoint whose next task is `node` (taken before it ran)."""
    before = [s for s in graph.get_state_history(config) if s.next == (node,)]
    assert before, f"no checkpoint before {node!r}"
    return dict(before[-1].config)


@pytest.fixture
def postgres_saver(tenant_db: TenantDB, conn: psycopg.Connection) -> Iterator[PostgresSaver]:
    """LangGraph's PostgresSaver on the same database, as the same tenant role, in a schema of its own (its
    table names, e.g. `checkpoints`, are ours too)."""
    with psycopg.connect(tenant_db.admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA lg_anchor AUTHORIZATION {}").format(sql.Identifier(tenant_db.role)))
    with psycopg.connect(tenant_db.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                         options="-c search_path=lg_anchor") as pg:
        saver = PostgresSaver(pg)  # type: ignore[arg-type]
        saver.setup()
        yield saver


def _charge_directly(payments_url: str) -> Callable[..., str]:
    @tool
    def pay(amount: int, to: str) -> str:
        """Charge `amount` cents to `to` (a plain LangGraph tool: one request per call)."""
        req = urllib.request.Request(f"{payments_url}/v1/charges", method="POST",
                                     data=json.dumps({"amount": amount, "to": to}).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Idempotency-Key": str(uuid.uuid4())})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return str(json.loads(resp.read())["id"])

    return pay


@tool("pay")
def pay_durably(amount: int, to: str) -> str:
    """Charge `amount` cents to `to` through the tenant's effect ledger."""
    return str(effect("payment", {"amount": amount, "to": to})["id"])


def test_time_travel_before_a_payment_charges_twice_with_postgres_saver_once_with_ours(
        nodedupe: Sinks, postgres_saver: PostgresSaver, conn: psycopg.Connection) -> None:
    anchor = payment_graph(_charge_directly(nodedupe.payments_url), postgres_saver)
    cfg = {"configurable": {"thread_id": "anchor-pay"}}
    anchor.invoke({"messages": [HumanMessage("pay acme 42 EUR")]}, cfg)
    assert nodedupe.payment_stats()["charges"] == 1
    anchor.invoke(None, _time_travel_before(anchor, cfg, "tools"))
    assert nodedupe.payment_stats()["charges"] == 2  # the anchor: the rollback pays again

    ours = payment_graph(pay_durably, TenantCheckpointer(conn, effects={"payment": payment_adapter(
        nodedupe.payments_url)}))
    cfg = {"configurable": {"thread_id": "ours-pay"}}
    first = ours.invoke({"messages": [HumanMessage("pay acme 42 EUR")]}, cfg)
    assert nodedupe.payment_stats()["charges"] == 3
    replayed = ours.invoke(None, _time_travel_before(ours, cfg, "tools"))
    assert nodedupe.payment_stats()["charges"] == 3  # ours: the replay returns the recorded charge
    assert replayed["messages"][-1].content == first["messages"][-1].content  # the same charge id
    # A new request later in the same thread is a new logical step: it is performed.
    ours.invoke({"messages": [HumanMessage("and pay acme again")]}, cfg)
    assert nodedupe.payment_stats()["charges"] == 4


def _scan_graph(checkpointer: BaseCheckpointSaver[Any], workdir: Path, released: Path, bound: bool) -> Any:
    """scan -> (pause for approval) -> release. `bound`: the verdict is a judgment bound to the files'
    digest (ours); otherwise only the graph state remembers it (a plain LangGraph graph)."""

    class ScanState(TypedDict, total=False):
        scan_passed: bool
        released: list[str]

    def scan(state: ScanState) -> ScanState:
        clean = all(b"MALWARE" not in p.read_bytes() for p in workdir.rglob("*") if p.is_file())
        if bound:
            judge("scan", clean, workdir)
        return {"scan_passed": clean}

    def release(state: ScanState) -> ScanState:
        if bound:
            require_judgment("scan", workdir)
        elif not state.get("scan_passed"):
            return {"released": []}
        released.mkdir(exist_ok=True)
        names = []
        for p in sorted(workdir.iterdir()):
            shutil.copy(p, released / p.name)
            names.append(p.name)
        return {"released": names}

    builder = StateGraph(ScanState)
    builder.add_node("scan", scan)
    builder.add_node("release", release)
    builder.add_edge(START, "scan")
    builder.add_edge("scan", "release")
    builder.add_edge("release", END)
    return builder.compile(checkpointer=checkpointer, interrupt_before=["release"])


@pytest.mark.parametrize("ours", [False, True], ids=["postgres_saver", "tenant_checkpointer"])
def test_a_scan_verdict_is_not_carried_onto_restored_files(tmp_path: Path, conn: psycopg.Connection,
                                                           postgres_saver: PostgresSaver, ours: bool) -> None:
    tenant = str(uuid.uuid4())
    objects = EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), tenant)
    workdir, released = tmp_path / "work", tmp_path / "released"
    workdir.mkdir()
    (workdir / "report.txt").write_bytes(b"quarterly figures\nMALWARE payload\n")
    infected_key, infected_digest = snapshot(conn, objects, workdir, scope="lg-scan")
    (workdir / "report.txt").write_bytes(b"quarterly figures\n")  # cleaned

    saver: BaseCheckpointSaver[Any] = TenantCheckpointer(conn, objects=objects) if ours else postgres_saver
    graph = _scan_graph(saver, workdir, released, bound=ours)
    cfg = {"configurable": {"thread_id": f"scan-{ours}"}}
    graph.invoke({}, cfg)
    assert graph.get_state(cfg).values["scan_passed"] is True
    assert graph.get_state(cfg).next == ("release",)

    restore_snapshot(objects, infected_key, workdir, infected_digest)  # the workspace goes back in time
    assert tree_digest(workdir) == infected_digest
    if not ours:
        graph.invoke(None, cfg)
        assert b"MALWARE" in (released / "report.txt").read_bytes()  # the anchor: unchecked files released
        return
    with pytest.raises(JudgmentInvalid, match="no 'scan' judgment bound"):
        graph.invoke(None, cfg)
    assert not released.exists()
