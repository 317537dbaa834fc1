"""Memory upkeep the host does by itself: fold a thread's older messages into a summary once its window
outgrows the token budget, for every thread that received messages since the last look.

The summarizer is the agent's (`Agent(..., summarize=fn)`, fn(previous summary, messages) -> text) or an
extractive default that needs no model. Either way the summary is budgeted (at most a quarter of the
window's budget), the log itself is never rewritten, and no message of any thread is lost: a message that
leaves the window stays in the log and in the summary's range.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from agent_runtime.state.memory import MemoryStore, Message, Summary

__all__ = ["Summarizer", "extractive_summary", "roll_over_threads"]

Summarizer = Callable[[Summary | None, list[Message]], str]


def extractive_summary(previous: Summary | None, messages: list[Message]) -> str:
    """No model needed: the previous summary, then the first line of each folded message."""
    lines = [previous.content] if previous else []
    lines += [f"{m.role}: {m.content.splitlines()[0][:160] if m.content else ''}" for m in messages]
    return "\n".join(lines)


def roll_over_threads(conn: psycopg.Connection, token_budget: int, summarize: Summarizer,
                      since_seq: int) -> tuple[int, list[str]]:
    """Roll over every thread with messages after `since_seq` whose window overflows; return the newest seq
    looked at (the next call's `since_seq`) and the threads that got a new summary."""
    rows = conn.execute("SELECT thread, max(seq) FROM messages WHERE seq > %s GROUP BY thread", (since_seq,)
                        ).fetchall()
    rolled = []
    for thread, _last in rows:
        store = MemoryStore(conn, thread)
        if store.rollover(token_budget, summarize) is not None:
            rolled.append(thread)
    newest = max((int(last) for _t, last in rows), default=since_seq)
    return newest, rolled
