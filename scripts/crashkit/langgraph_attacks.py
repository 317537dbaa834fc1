"""LangGraph, side by side: the duplicate executions users report upstream, and a schema restored from an
archive, each run with PostgresSaver + a plain tool and with TenantCheckpointer + `effect()`/`durable_effect`,
counted as charges at the payments peer (de-duplication off)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from langgraph.types import Command, RetryPolicy
from psycopg import sql

from agent_runtime.errors import EffectInDoubt
from agent_runtime.state.migrations import migrate
from tests.runtime.harness import Peers, Proc, TenantDB, dump_schema, request_queued_at, restore_schema

from . import graphs
from .core import KIT_PATH, Kit, Outcome, Tally, attack


@dataclass(frozen=True)
class LgTenant:
    t: TenantDB
    objects_dir: Path
    object_key: bytes
    tenant_id: str

    def ours(self, payments_url: str, **adapter_options: Any) -> tuple[Any, psycopg.Connection[Any]]:
        return graphs.our_saver(self.t.dsn, self.t.schema, str(self.objects_dir), self.object_key, self.tenant_id,
                                payments_url, **adapter_options)

    def plain(self) -> tuple[Any, psycopg.Connection[Any]]:
        return graphs.plain_saver(self.t.dsn)


@contextmanager
def lg_tenant(kit: Kit, label: str) -> Iterator[LgTenant]:
    """A tenant database with our schema (migrated) and PostgresSaver's (`lg_anchor`), both the tenant role's."""
    with kit.tenant() as t:
        with psycopg.connect(t.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(graphs.ANCHOR_SCHEMA),
                                                                              sql.Identifier(t.role)))
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            migrate(conn, t.schema)
        yield LgTenant(t, kit.scratch(label), os.urandom(32), str(uuid.uuid4()))


def _charges(peers: Peers) -> int:
    return int(peers.payment_stats()["charges"])


def _quiet_charges(peers: Peers, settle_s: float = 1.0) -> int:
    """The charge count once it stopped moving for `settle_s` (a cancelled attempt's thread may still post)."""
    last, since = _charges(peers), time.monotonic()
    while time.monotonic() - since < settle_s:
        time.sleep(0.1)
        now = _charges(peers)
        if now != last:
            last, since = now, time.monotonic()
    return last


def _count(tally: Tally, made: int, expected: int) -> None:
    tally.dup += max(0, made - expected)
    tally.lost += max(0, expected - made)


# --- a schema restored from an archive taken before the payment --------------------------------------------
@attack("lg-schema-restore",
        "schema restored from a pg_dump taken before the payment (paused before the tool), thread resumed",
        "charges per thread at the payments peer (1 expected)", langgraph=True)
def lg_schema_restore(kit: Kit, out: Outcome, runs: int) -> None:
    out.plain = Tally()
    with lg_tenant(kit, "lg-schema-restore") as lt, kit.peers("lg-schema-restore-peers", dedupe=False) as peers:
        archive = lt.objects_dir.parent / f"{lt.objects_dir.name}.dump"
        for i in range(runs):
            for side in ("plain", "ours"):
                tally = out.plain if side == "plain" else out.ours
                schema = graphs.ANCHOR_SCHEMA if side == "plain" else lt.t.schema
                cfg = {"configurable": {"thread_id": f"{side}-restore-{i}"}}
                before = _charges(peers)

                def graph(side: str = side) -> tuple[Any, psycopg.Connection[Any]]:
                    saver, conn = lt.plain() if side == "plain" else lt.ours(peers.payments_url)
                    pay = (graphs.plain_pay_tool(peers.payments_url) if side == "plain"
                           else graphs.durable_pay_tool())
                    return graphs.payment_graph(pay, saver, interrupt_before=["tools"]), conn

                g, conn = graph()
                with conn:
                    g.invoke(graphs.human("pay acme 42 EUR"), cfg)  # paused before the tool
                    dump_schema(lt.t, schema, archive, kit.admin_dsn)  # the nightly archive
                    g.invoke(None, cfg)  # approved: the payment is made
                restore_schema(lt.t, schema, archive, kit.admin_dsn)  # recovery from that archive
                g, conn = graph()
                with conn:
                    g.invoke(None, cfg)  # the thread is resumed where the archive left it
                made = _charges(peers) - before
                _count(tally, made, 1)
                kit.say(f"run {i + 1}/{runs} {side:>5}: restored before the payment, resumed: {made} charge(s)")
            out.runs += 1


# --- a long tool call re-executed after a timeout ------------------------------------------------------------
STALL_S = 1.6  # the provider sits on the charge this long before answering
NODE_TIMEOUT_S = 1.0


def _retryable(exc: Exception) -> bool:
    """What a user adds to the tool node's RetryPolicy for a slow provider (the same on both sides)."""
    return isinstance(exc, TimeoutError | EffectInDoubt) or type(exc).__name__ == "NodeTimeoutError"


def _stall_provider(peers: Peers) -> threading.Thread:
    """Stop the payments peer now; resume it STALL_S after the first request reached it (a slow provider: the
    request is accepted by the kernel and answered late)."""
    port = int(peers.payments_url.rsplit(":", 1)[1])
    peers.payments.kill(signal.SIGSTOP)

    def resume_later() -> None:
        try:
            deadline = time.monotonic() + 15
            while not request_queued_at(port) and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(STALL_S)
        finally:
            peers.payments.kill(signal.SIGCONT)

    thread = threading.Thread(target=resume_later, daemon=True)
    thread.start()
    return thread


@attack("lg-timeout-retry",
        f"tool node timeout {NODE_TIMEOUT_S:.0f} s + RetryPolicy(max_attempts=3); the provider answers the charge "
        f"after {STALL_S} s",
        "charges per thread at the payments peer (1 expected)", langgraph=True)
def lg_timeout_retry(kit: Kit, out: Outcome, runs: int) -> None:
    out.plain = Tally()
    retry = RetryPolicy(initial_interval=0.2, jitter=False, max_attempts=3, retry_on=_retryable)
    with lg_tenant(kit, "lg-timeout-retry") as lt, kit.peers("lg-timeout-retry-peers", dedupe=False) as peers:
        for i in range(runs):
            for side in ("plain", "ours"):
                tally = out.plain if side == "plain" else out.ours
                before = _charges(peers)
                ended = asyncio.run(_invoke_with_timeouts(lt, side, peers, retry, f"{side}-timeout-{i}"))
                made = _quiet_charges(peers) - before
                _count(tally, made, 1)
                kit.say(f"run {i + 1}/{runs} {side:>5}: slow provider, node timeout + retries ({ended}): "
                        f"{made} charge(s)")
            out.runs += 1


async def _invoke_with_timeouts(lt: LgTenant, side: str, peers: Peers, retry: RetryPolicy, thread: str) -> str:
    """Run the payment graph once (ainvoke: LangGraph times out async nodes only) against a stalled provider;
    if every attempt timed out, the user runs it again once the provider is back. Says how it ended."""
    if side == "plain":
        saver, conn = await graphs.plain_async_saver(lt.t.dsn)
        pay = graphs.plain_pay_tool(peers.payments_url)
    else:
        saver, conn = lt.ours(peers.payments_url)
        pay = graphs.durable_pay_tool()
    g = graphs.payment_graph(pay, saver, tools_timeout_s=NODE_TIMEOUT_S, retry=retry)
    cfg = {"configurable": {"thread_id": thread}}
    resumer = _stall_provider(peers)
    try:
        try:
            await g.ainvoke(graphs.human("pay acme 42 EUR"), cfg)
            return "answered"
        except Exception as exc:  # noqa: BLE001 - every attempt timed out: the user runs it again
            await asyncio.to_thread(resumer.join)
            await g.ainvoke(None, cfg)
            return f"{type(exc).__name__}, invoked again"
    finally:
        await asyncio.to_thread(resumer.join)
        if side == "plain":
            await conn.close()
        else:
            conn.close()


# --- a crash between the provider's answer and the checkpoint ----------------------------------------------
RECEIPT_S = 1.0  # the tool keeps working this long after the charge (filing the receipt)


def _child(kit: Kit, lt: LgTenant, side: str, action: str, thread: str, payments_url: str, log: Path) -> Proc:
    spec = {"side": side, "action": action, "thread": thread, "dsn": lt.t.dsn, "schema": lt.t.schema,
            "objects_dir": str(lt.objects_dir), "object_key": base64.b64encode(lt.object_key).decode(),
            "tenant_id": lt.tenant_id, "payments_url": payments_url, "receipt_s": RECEIPT_S}
    env = {**os.environ, "PYTHONPATH": KIT_PATH}
    return Proc([sys.executable, "-m", "crashkit.lg_child", json.dumps(spec)], env, log)


@attack("lg-crash-before-checkpoint",
        "the graph's process SIGKILLed after the provider's 200, before the tool node's writes and checkpoint; "
        "the thread resumed in a new process",
        "charges per thread at the payments peer (1 expected)", langgraph=True)
def lg_crash_before_checkpoint(kit: Kit, out: Outcome, runs: int) -> None:
    out.plain = Tally()
    scratch = kit.scratch("lg-crash-before-checkpoint")
    kill_file = scratch / "kill.pid"
    with lg_tenant(kit, "lg-crash-objects") as lt, \
            kit.peers("lg-crash-peers", dedupe=False,
                      payments_env={"AGENT_PAYMENTS_KILL_PID_FILE": str(kill_file)}) as peers:
        for i in range(runs):
            for side in ("plain", "ours"):
                tally = out.plain if side == "plain" else out.ours
                thread = f"{side}-crash-{i}"
                before = _charges(peers)
                first = _child(kit, lt, side, "start", thread, peers.payments_url, scratch / f"{thread}-1.log")
                kill_file.write_text(str(first.pid))
                charged_at: float | None = None
                t0 = time.monotonic()
                while first.alive():  # the peer kills it right after its 200; if it cannot, the kit does
                    if charged_at is None and _charges(peers) > before:
                        charged_at = time.monotonic()
                    if charged_at is not None and time.monotonic() - charged_at > RECEIPT_S / 3:
                        first.kill(signal.SIGKILL)
                        out.note("the payments peer did not kill the graph's process (no "
                                 "AGENT_PAYMENTS_KILL_PID_FILE?): the kit did, during the receipt")
                    if time.monotonic() - t0 > 60:
                        raise TimeoutError(f"{thread}: no charge:\n{first.output()[-1500:]}")
                    time.sleep(0.005)
                kill_file.unlink(missing_ok=True)
                first.stop()
                out.kills += 1
                second = _child(kit, lt, side, "resume", thread, peers.payments_url, scratch / f"{thread}-2.log")
                try:
                    code = second.wait(timeout=60)
                finally:
                    second.stop()
                made = _quiet_charges(peers, 0.3) - before
                _count(tally, made, 1)
                if code != 0:
                    tally.lost += 1
                    out.note(f"{thread}: the resumed process exited {code}: {second.output()[-300:]}")
                kit.say(f"run {i + 1}/{runs} {side:>5}: killed after the 200, resumed in a new process "
                        f"(exit {code}): {made} charge(s)")
            out.runs += 1


# --- interrupt() inside a loop: the node body replays on every resume ---------------------------------------
ITEMS = [1100, 1200, 1300]


@attack("lg-interrupt-loop",
        f"a node charges {len(ITEMS)} items, interrupt() after each; resumed {len(ITEMS)} times (the body replays)",
        f"charges per thread at the payments peer ({len(ITEMS)} expected)", langgraph=True)
def lg_interrupt_loop(kit: Kit, out: Outcome, runs: int) -> None:
    out.plain = Tally()
    with lg_tenant(kit, "lg-interrupt-loop") as lt, kit.peers("lg-interrupt-loop-peers", dedupe=False) as peers:
        plain_charge, durable_charge = graphs.item_chargers(peers.payments_url)
        for i in range(runs):
            for side in ("plain", "ours"):
                tally = out.plain if side == "plain" else out.ours
                saver, conn = lt.plain() if side == "plain" else lt.ours(peers.payments_url)
                g = graphs.loop_graph(plain_charge if side == "plain" else durable_charge, saver)
                cfg = {"configurable": {"thread_id": f"{side}-loop-{i}"}}
                before = _charges(peers)
                with conn:
                    result = g.invoke({"items": ITEMS}, cfg)
                    for _ in ITEMS:
                        result = g.invoke(Command(resume=True), cfg)
                made = _charges(peers) - before
                _count(tally, made, len(ITEMS))
                if len(result.get("charged", [])) != len(ITEMS):
                    tally.lost += 1
                kit.say(f"run {i + 1}/{runs} {side:>5}: {len(ITEMS)} items, {len(ITEMS)} resumes: {made} charge(s)")
            out.runs += 1
