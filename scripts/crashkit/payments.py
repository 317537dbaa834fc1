"""Attacks on the effect ledger inside agent-host: a SIGKILL right after a lagging provider's 200, and a SIGKILL
between the effect journal's write and the ledger table's. Counted at the payments peer and the SMTP relay."""

from __future__ import annotations

import json
import signal
import time
import urllib.parse
import urllib.request
from typing import Any

import psycopg

from agent_runtime.db import connect
from agent_runtime.effects.config import payments_api_spec
from agent_runtime.effects.journal import EffectJournal
from agent_runtime.effects.ledger import idempotency_key
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .core import Kit, Outcome, attack, settled, tenant_store, wait_for

SEARCH_LAG_S = 3.0  # the provider's search shows a charge this long after it was made
LOOKUP_CONSISTENCY_S = 5.0  # what the instance declares: "absent" is not trusted for this long after an attempt


def _searchable(payments_url: str, key: str) -> bool:
    query = urllib.parse.quote(f"metadata['idempotency_key']:'{key}'")
    with urllib.request.urlopen(f"{payments_url}/v1/charges/search?query={query}", timeout=5) as resp:  # noqa: S310
        return bool(json.loads(resp.read())["data"])


@attack("payment-search-lag",
        f"provider ignores Idempotency-Key, its search lags {SEARCH_LAG_S:.0f} s; agent-host SIGKILLed by the "
        "provider right after its 200; reboot",
        "charges per task at the payments peer; a task not done = lost")
def payment_search_lag(kit: Kit, out: Outcome, runs: int) -> None:
    scratch = kit.scratch("payment-search-lag")
    kill_file = scratch / "kill.pid"
    peer_env = {"AGENT_PAYMENTS_SEARCH_LAG_S": str(SEARCH_LAG_S), "AGENT_PAYMENTS_KILL_PID_FILE": str(kill_file)}
    with kit.tenant() as t, kit.peers("payment-search-lag-peers", dedupe=False, payments_env=peer_env) as peers, \
            kit.hosts("payment-search-lag-hosts") as hosts, connect(t.dsn, t.schema, autocommit=True) as conn:
        migrate(conn, t.schema)
        spec = {**payments_api_spec(peers.payments_url), "lookup_consistency_s": LOOKUP_CONSISTENCY_S}
        env = kit.host_env(t, scratch, AGENT_EFFECTS=json.dumps({"payment": spec}), AGENT_EFFECT_RETRY_MAX_S="1")
        host = hosts.start(env)
        try:
            hosts.wait_ready(env)
        except RuntimeError as exc:
            if "lookup_consistency_s" not in str(exc):
                raise
            # A runtime without the setting: run the attack anyway, so the table shows what it does.
            out.note("agent-host refused lookup_consistency_s (not supported by this runtime): run without it")
            del spec["lookup_consistency_s"]
            env["AGENT_EFFECTS"] = json.dumps({"payment": spec})
            host = hosts.start(env)
            hosts.wait_ready(env)
        for i in range(runs):
            kill_file.write_text(str(host.pid))
            tid = tasks.submit(conn, "ck_pay", {"amount": 100 + i})
            key = idempotency_key(tid, "charge", "payment")
            t0 = time.monotonic()
            charged_at: float | None = None
            while host.alive():  # the peer kills it; if it cannot, the kit does, right after the charge landed
                if charged_at is None and peers.payment_stats()["charges_by_key"].get(key):
                    charged_at = time.monotonic()
                if charged_at is not None and time.monotonic() - charged_at > 1.0:
                    host.kill(signal.SIGKILL)
                    out.note("the payments peer did not kill the host (no AGENT_PAYMENTS_KILL_PID_FILE?): the kit "
                             "did, up to 1 s after the charge")
                if time.monotonic() - t0 > 20:
                    raise TimeoutError(f"run {i}: the charge never reached the provider:\n{host.output()[-1500:]}")
                time.sleep(0.01)
            kill_file.unlink(missing_ok=True)
            host.wait()
            out.kills += 1
            if _searchable(peers.payments_url, key):
                out.error = ("the payments peer's search does not lag (AGENT_PAYMENTS_SEARCH_LAG_S not supported): "
                             "the attack was not exercised")
            host = hosts.start(env)
            status, reason = settled(conn, tid, LOOKUP_CONSISTENCY_S + 20)
            charges = peers.payment_stats()["charges_by_key"].get(key, 0)
            out.ours.dup += max(0, charges - 1)
            out.ours.lost += status != "done" or charges == 0
            out.runs += 1
            resolution = conn.execute("SELECT resolution FROM effects WHERE idem_key = %s", (key,)).fetchone()
            kit.say(f"run {i + 1}/{runs}: SIGKILL after the 200, reboot: task {status}"
                    f"{f' ({reason})' if reason else ''}, {charges} charge(s), resolution "
                    f"{resolution[0] if resolution else None}")


def _update_waits_on_lock(admin: psycopg.Connection, dbname: str) -> bool:
    row = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'"
                        " AND application_name LIKE 'agent-host:%%'", (dbname,)).fetchone()
    return bool(row and row[0])


@attack("journal-before-table",
        "SIGKILL between the effect journal's write (committed) and the ledger table's (still intent); reboot",
        "messages per task at the SMTP relay (no lookup); a task not done without a human = lost")
def journal_before_table(kit: Kit, out: Outcome, runs: int) -> None:
    scratch = kit.scratch("journal-before-table")
    with kit.tenant() as t, kit.peers("journal-before-table-peers") as peers, \
            kit.hosts("journal-before-table-hosts") as hosts, connect(t.dsn, t.schema, autocommit=True) as conn, \
            psycopg.connect(t.admin_dsn, autocommit=True) as admin:
        migrate(conn, t.schema)
        env = kit.host_env(t, scratch, AGENT_SMTP_URL=peers.smtp_url, AGENT_EFFECT_RETRY_MAX_S="1")
        journal = EffectJournal(tenant_store(env))
        host = hosts.start(env)
        hosts.wait_ready(env)
        out.note("the window is hit by a real SIGKILL: the kit holds the effect's row lock, so the host's table "
                 "write waits after its journal write; its server sessions are ended with it")
        for i in range(runs):
            # The relay is stopped so the message is in flight when the kit takes the row lock; then it resumes.
            peers.smtp.kill(signal.SIGSTOP)
            try:
                tid = tasks.submit(conn, "ck_mail", {})
                key = idempotency_key(tid, "send", "email")
                wait_for("the email's intent", lambda key=key: conn.execute(
                    "SELECT 1 FROM effects WHERE idem_key = %s", (key,)).fetchone(), 20, 0.002)
                lock: psycopg.Connection[Any] = psycopg.connect(t.dsn, autocommit=False)
                lock.execute("SELECT 1 FROM effects WHERE idem_key = %s FOR UPDATE", (key,))
            finally:
                peers.smtp.kill(signal.SIGCONT)
            try:
                wait_for("the journal to say committed", lambda key=key: (
                    (e := journal.get(key)) is not None and e.state == "committed"), 20)
                wait_for("the host's table write to wait", lambda: _update_waits_on_lock(admin, t.dbname), 10)
                host.kill(signal.SIGKILL)
                host.wait()
                out.kills += 1
                # The server would still run the dead host's UPDATE once the lock goes: end its sessions first, as
                # the loss of its machine does, so that write never commits.
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                              " AND application_name LIKE 'agent-host:%%'", (t.dbname,))
                wait_for("the host's sessions to end", lambda: not admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'agent-host:%%'",
                    (t.dbname,)).fetchone(), 10)
            finally:
                lock.rollback()
                lock.close()
            row = conn.execute("SELECT state FROM effects WHERE idem_key = %s", (key,)).fetchone()
            if not row or row[0] != "intent":
                out.note(f"run {i + 1}: the table already said {row[0] if row else None} (window missed)")
            host = hosts.start(env)
            status, reason = settled(conn, tid, 20)
            sent = sum(1 for e in peers.emails() if e["subject"] == f"kit {tid}")
            out.ours.dup += max(0, sent - 1)
            out.ours.lost += status != "done" or sent == 0
            out.runs += 1
            resolution = conn.execute("SELECT resolution FROM effects WHERE idem_key = %s", (key,)).fetchone()
            kit.say(f"run {i + 1}/{runs}: killed with journal=committed, table=intent; reboot: task {status}"
                    f"{f' ({reason})' if reason else ''}, {sent} message(s), resolution "
                    f"{resolution[0] if resolution else None}")
