"""An intent's INSERT lost with its connection (a pooler or server restart mid-statement): the provider was never
called, so the retry sends once, and never asks a human about a call that was never made (issue 39's concurrent
journal create had made that likelier; CI met it through a PgBouncer SIGKILL).

Real PostgreSQL and real cuts: the INSERT is held on the task row's lock by another session, then either its
backend is terminated (the INSERT never commits) or its client socket is shut down (the INSERT commits once the
lock goes, and its answer is lost). The email goes through the real SMTP sink, which has no lookup.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from agent_runtime.db import connect
from agent_runtime.effects.journal import INSERT_LOST, EffectJournal, JournalEntry
from agent_runtime.effects.ledger import EffectLedger
from agent_runtime.effects.smtp import SmtpEffect
from agent_runtime.errors import EffectInDoubt, TaskBlocked
from agent_runtime.state import tasks
from agent_runtime.state.objectstore import EncryptedObjectStore, FileObjectStore
from tests.runtime.conftest import Sinks, TenantDB

MAIL = {"from": "agent@example.test", "to": "customer@example.test", "subject": "Receipt", "body": "Paid."}


@pytest.fixture
def journal(tmp_path: Path) -> EffectJournal:
    return EffectJournal(EncryptedObjectStore(FileObjectStore(tmp_path / "objects"), os.urandom(32), "tenant"))


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as p:
        yield p


def _session(tenant_db: TenantDB) -> psycopg.Connection:
    return connect(tenant_db.dsn, tenant_db.schema, autocommit=True)


def _until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _cut_during_insert(tenant_db: TenantDB, pool: ThreadPoolExecutor, journal: EffectJournal, task_id: UUID,
                       how: str, explicit_key: str | None = None) -> BaseException:
    """Run the email's first attempt on a session of its own, hold its INSERT on the task row's lock, cut the
    session (`how`: 'terminate' the backend, or 'shutdown' the client's socket), then let the lock go."""
    victim = _session(tenant_db)
    pid = victim.info.backend_pid
    ledger = EffectLedger(victim, "tenant", journal)
    holder = _session(tenant_db)
    watcher = _session(tenant_db)
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task_id,))
        attempt: Future[Any] = pool.submit(ledger.run, task_id, "notify", "email", SmtpEffect("smtp://127.0.0.1:9"),
                                           MAIL, explicit_key=explicit_key)
        _until(lambda: watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                       (pid,)).fetchone() == ("Lock",), "the INSERT to wait on the task row")
        if how == "terminate":
            assert watcher.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        else:
            with socket.socket(fileno=os.dup(victim.pgconn.socket)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        error = attempt.exception(timeout=20)
        assert error is not None, "the attempt should have failed with its connection"
        holder.execute("ROLLBACK")
        # The server's side of the cut session ends on its own: terminated, or after its INSERT ran and its
        # answer found no client.
        _until(lambda: watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                       (pid,)).fetchone() == (0,), "the cut session to end")
        return error
    finally:
        for c in (holder, watcher, victim):
            c.close()


def _effect_rows(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT state, resolution FROM effects ORDER BY id").fetchall()


@pytest.mark.parametrize("how", ["terminate", "shutdown"])
def test_an_intent_insert_lost_with_its_connection_is_sent_once_by_the_retry(
        conn: psycopg.Connection, tenant_db: TenantDB, sinks: Sinks, journal: EffectJournal,
        pool: ThreadPoolExecutor, how: str) -> None:
    task_id = tasks.submit(conn, "notifier", {})
    error = _cut_during_insert(tenant_db, pool, journal, task_id, how)
    assert isinstance(error, psycopg.OperationalError)
    # 'terminate' rolled the INSERT back; 'shutdown' let it commit with nobody to hear it. Either way the journal
    # holds the intent (created beside the INSERT), and the provider was never called.
    assert _effect_rows(conn) == ([] if how == "terminate" else [("intent", None)])
    assert sinks.emails() == []
    key = EffectLedger(conn, "tenant").key_for(task_id, "notify", "email")
    entry = journal.get(key)
    assert entry is not None and (entry.state, entry.resolution) == ("intent", INSERT_LOST)

    retry = EffectLedger(conn, "tenant", journal)
    result = retry.run(task_id, "notify", "email", SmtpEffect(sinks.smtp_url), MAIL)
    assert len(sinks.emails()) == 1
    assert _effect_rows(conn) == [("committed", f"{INSERT_LOST}:performed")]
    # And never again: the replay answers from the ledger.
    assert retry.run(task_id, "notify", "email", SmtpEffect(sinks.smtp_url), MAIL) == result
    assert len(sinks.emails()) == 1
    final = journal.get(key)
    assert final is not None and final.state == "committed"


def test_an_authors_key_whose_insert_was_lost_is_sent_once_by_the_retry(
        conn: psycopg.Connection, tenant_db: TenantDB, sinks: Sinks, journal: EffectJournal,
        pool: ThreadPoolExecutor) -> None:
    """An author's key keeps the serial order (INSERT, then journal): the lost INSERT's attempt creates the
    journal's intent itself, then says the INSERT was lost."""
    task_id = tasks.submit(conn, "notifier", {})
    _cut_during_insert(tenant_db, pool, journal, task_id, "shutdown", explicit_key="receipt-42")
    assert _effect_rows(conn) == [("intent", None)]
    retry = EffectLedger(conn, "tenant", journal)
    retry.run(task_id, "notify", "email", SmtpEffect(sinks.smtp_url), MAIL, explicit_key="receipt-42")
    assert len(sinks.emails()) == 1
    assert _effect_rows(conn) == [("committed", f"{INSERT_LOST}:performed")]


class Unanswered:
    """A call whose outcome never comes back (a timeout after the request left): in doubt."""

    supports_lookup = False
    replay_safe = False

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        raise TimeoutError("no answer")


def test_a_row_of_an_earlier_attempt_stays_in_doubt_when_a_later_insert_is_lost(
        conn: psycopg.Connection, tenant_db: TenantDB, sinks: Sinks, journal: EffectJournal,
        pool: ThreadPoolExecutor) -> None:
    """A row from before the journal, in doubt (its call may have landed), and a journaled replay whose INSERT
    (which loses to that row) is cut: the lost attempt says nothing about the earlier one, so a human decides."""
    task_id = tasks.submit(conn, "notifier", {})
    with pytest.raises(EffectInDoubt):
        EffectLedger(conn, "tenant").run(task_id, "notify", "email", Unanswered(), MAIL)
    _cut_during_insert(tenant_db, pool, journal, task_id, "shutdown")
    key = EffectLedger(conn, "tenant").key_for(task_id, "notify", "email")
    entry = journal.get(key)
    assert entry is not None and entry.resolution == INSERT_LOST  # the journal's word, which the row overrules
    with pytest.raises(TaskBlocked, match="a human must decide"):
        EffectLedger(conn, "tenant", journal).run(task_id, "notify", "email", SmtpEffect(sinks.smtp_url), MAIL)
    assert sinks.emails() == []
    assert _effect_rows(conn) == [("blocked", "no_provider_lookup")]


def journal_entry(state: str, attempted_at: float, resolution: str | None = None) -> JournalEntry:
    return JournalEntry("eff-1", "00000000-0000-0000-0000-000000000001", "notify", "email", MAIL, "d", state,
                        {"id": "m"} if state == "committed" else None, resolution, 0, None, 1, attempted_at)


def test_the_lost_insert_holds_only_while_its_own_intent_is_the_last_record(journal: EffectJournal) -> None:
    """A racer's intent or an outcome written after the lost attempt's own intent means the provider may have been
    called since: the lost attempt's record no longer answers (on S3 too: test_s3_objectstore.py)."""
    assert journal.create(journal_entry("intent", 100.0))
    journal.insert_lost(journal_entry("intent", 100.0))
    got = journal.get("eff-1")
    assert got is not None and (got.resolution, got.revision) == (INSERT_LOST, 2)

    journal.put(journal_entry("intent", 101.5))  # a racer's intent, its own attempt
    got = journal.get("eff-1")
    assert got is not None and (got.state, got.resolution, got.attempted_at) == ("intent", None, 101.5)

    journal.put(journal_entry("committed", 100.0))
    got = journal.get("eff-1")
    assert got is not None and (got.state, got.resolution) == ("committed", None)


def test_an_intent_left_by_an_unanswered_call_is_still_in_doubt(
        conn: psycopg.Connection, sinks: Sinks, journal: EffectJournal) -> None:
    """The other side of the line: a call that went out and never answered leaves no lost-INSERT record, so the
    retry asks (here: a human, SMTP has no lookup) and never re-sends."""
    task_id = tasks.submit(conn, "notifier", {})
    with pytest.raises(EffectInDoubt):
        EffectLedger(conn, "tenant", journal).run(task_id, "notify", "email", Unanswered(), MAIL)
    with pytest.raises(TaskBlocked, match="a human must decide"):
        EffectLedger(conn, "tenant", journal).run(task_id, "notify", "email", SmtpEffect(sinks.smtp_url), MAIL)
    assert sinks.emails() == []
