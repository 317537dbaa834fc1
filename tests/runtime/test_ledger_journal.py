"""The ledger outlives a restore of the tenant schema: a real pg_dump taken mid-task, effects committed
after it, the schema dropped and restored with pg_restore (what the control plane's recovery does), and
the resumed task replays the effects from the journal instead of performing them again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_runtime.effects.journal import EffectJournal
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks

from .conftest import ADMIN_DSN, Sinks, TenantDB, payment_adapter
from .harness import dump_schema, restore_schema


def _dump(t: TenantDB, path: Path) -> None:
    dump_schema(t, t.schema, path, ADMIN_DSN)


def _restore(t: TenantDB, path: Path) -> None:
    restore_schema(t, t.schema, path, ADMIN_DSN)


checkout = Agent("checkout")


@checkout.step
def prepare(ctx: Context) -> Any:
    ctx.rt.stop_event.set()  # the host stops here (a deploy): the backup job archives the schema meanwhile
    return {"order": ctx.params["order"]}


@checkout.step
def charge(ctx: Context) -> Any:
    paid = ctx.effect("payment", {"amount": 4200, "currency": "EUR", "to": "acct_1"})
    mail = ctx.effect("email", {"from": "shop@t", "to": "ada@t", "subject": f"receipt {ctx.task_id}",
                                "body": "paid"})
    ctx.rt.stop_event.set()
    return {"charge": paid["id"], "mail": mail["message_id"]}


@checkout.step
def thank(ctx: Context) -> Any:
    return True


def test_effects_committed_after_an_archive_are_not_performed_again_after_its_restore(
        runtime: Runtime, sinks: Sinks, nodedupe: Sinks, tenant_db: TenantDB, tmp_path: Path) -> None:
    rt = runtime  # `nodedupe`: a payment provider that would charge twice
    rt.effects["payment"] = payment_adapter(nodedupe.payments_url)
    archive = tmp_path / "schema.dump"
    tid = tasks.submit(rt.conn, "checkout", {"order": 7})
    assert run_task(rt, checkout, tid) == "stopped"
    _dump(tenant_db, archive)  # the archive: `prepare` done, no effect yet
    rt.stop_event.clear()
    assert run_task(rt, checkout, tid) == "stopped"  # `charge` ran and committed both effects
    assert rt.conn.execute("SELECT count(*) FROM effects WHERE state = 'committed'").fetchone()[0] == 2
    assert nodedupe.payment_stats()["charges"] == 1 and len(sinks.emails()) == 1
    # The control plane's recovery restores the schema from that archive: the task is back before `charge`.
    _restore(tenant_db, archive)
    assert rt.conn.execute("SELECT count(*) FROM effects").fetchone()[0] == 0
    rt.stop_event.clear()
    assert run_task(rt, checkout, tid) == "stopped"
    rt.stop_event.clear()
    assert run_task(rt, checkout, tid) == "done"
    stats = nodedupe.payment_stats()
    assert stats["charges"] == 1 and stats["posts"] == 1, stats  # the provider was not called again
    assert len(sinks.emails()) == 1  # the receipt was not sent again
    rows = rt.conn.execute("SELECT effect, state, resolution FROM effects ORDER BY id").fetchall()
    assert rows == [("payment", "committed", "journal:performed"), ("email", "committed", "journal:performed")]
    journal = EffectJournal(rt.store)
    assert all(journal.get(k) is not None for (k,) in rt.conn.execute("SELECT idem_key FROM effects"))


class Unanswered:
    """A provider that never answers and cannot be asked: every call is in doubt."""

    supports_lookup = False
    replay_safe = False

    def __init__(self) -> None:
        self.calls: list[str] = []

    def perform(self, idem_key: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(idem_key)
        raise TimeoutError("the provider did not answer")

    def lookup(self, idem_key: str) -> Any:  # pragma: no cover - supports_lookup is False
        raise NotImplementedError


notifier = Agent("notifier")


@notifier.step
def notify(ctx: Context) -> Any:
    return ctx.effect("notify", {"text": "hello"})


def test_an_intent_lost_by_a_restore_is_in_doubt_not_absent(runtime: Runtime, tenant_db: TenantDB,
                                                              tmp_path: Path) -> None:
    """The journal held the intent before the call; a restore lost the row: the replay asks, never re-sends."""
    rt = runtime
    hook = Unanswered()
    rt.effects["notify"] = hook
    archive = tmp_path / "schema.dump"
    tid = tasks.submit(rt.conn, "notifier", {})
    _dump(tenant_db, archive)
    assert run_task(rt, notifier, tid) == "retry"  # in doubt
    _restore(tenant_db, archive)
    assert rt.conn.execute("SELECT count(*) FROM effects").fetchone()[0] == 0
    assert run_task(rt, notifier, tid) == "blocked"
    assert len(hook.calls) == 1  # a human decides; never performed blind a second time
    assert rt.conn.execute("SELECT state, resolution FROM effects").fetchone() == ("blocked", "no_provider_lookup")


def test_a_decision_made_without_the_journal_is_not_undone_by_it(runtime: Runtime) -> None:
    """The newer of table and journal wins: an operator's "send it again" through a ledger that has no
    journal (e.g. the control plane's) is not taken back by the journal's older "blocked"."""
    from agent_runtime.effects.ledger import EffectLedger

    rt = runtime
    hook = Unanswered()
    rt.effects["notify"] = hook
    tid = tasks.submit(rt.conn, "notifier", {})
    assert run_task(rt, notifier, tid) == "retry"
    assert run_task(rt, notifier, tid) == "blocked"
    key = rt.conn.execute("SELECT idem_key FROM effects").fetchone()[0]
    EffectLedger(rt.conn).decide(key, performed=False)  # no journal: the table alone moves on
    assert run_task(rt, notifier, tid) == "retry"  # performed again, as the human ordered
    assert len(hook.calls) == 2
    assert rt.ledger.get(key).resolution is None  # in doubt again, not reverted to the journal's "blocked"
