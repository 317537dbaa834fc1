"""The agents the kit's attacks run inside real agent-host processes (AGENT_APP=crashkit.agents:AGENTS), written
on the public SDK only. Test-only switches (wait for a file, log every fold) live here, never in an example
agent a task submitter could reach on a real instance."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from agent_runtime.sdk import Agent, Context, Step
from agent_runtime.state.workspace import snapshot

UNSCANNED_MARKER = "CRASHKIT-UNSCANNED-PAYLOAD"

# --- payments: one charge per task --------------------------------------------------------------------------
pay = Agent("ck_pay")


@pay.step
def charge(ctx: Context) -> Any:
    return ctx.effect("payment", {"amount": int(ctx.params["amount"]), "currency": "EUR", "to": "acct_kit"})["id"]


@pay.step
def receipt(ctx: Context) -> Any:
    return True


# --- email: one message per task, through a standard relay (no lookup) --------------------------------------
mail = Agent("ck_mail")


@mail.step
def send(ctx: Context) -> Any:
    return ctx.effect("email", {"from": "kit@tenant.test", "to": "ada@tenant.test",
                                "subject": f"kit {ctx.task_id}", "body": "hello"})["message_id"]


# --- release: fetch (infected) -> clean -> scan -> release, the release waiting for the kit mid-step ---------
class ReleaseAgent:
    kind = "ck_release"

    def steps(self, params: dict[str, Any]) -> list[Step]:
        return [Step("fetch", self.fetch), Step("clean", self.clean), Step("scan", self.scan),
                Step("release", self.release)]

    def fetch(self, ctx: Context) -> Any:
        (ctx.workdir / "main.py").write_text("print('hello')\n")
        (ctx.workdir / "payload.bin").write_text(UNSCANNED_MARKER)
        snapshot(ctx.rt.conn, ctx.rt.store, ctx.workdir, scope=f"ck-pre-clean/{ctx.task_id}")
        return True

    def clean(self, ctx: Context) -> Any:
        (ctx.workdir / "payload.bin").unlink(missing_ok=True)
        return True

    def scan(self, ctx: Context) -> Any:
        infected = [p.name for p in ctx.workdir.iterdir() if UNSCANNED_MARKER in p.read_text()]
        ctx.judge("scan", passed=not infected)
        return {"infected": infected}

    def release(self, ctx: Context) -> Any:
        ctx.require_judgment("scan")
        # Tell the kit the gate passed, then wait (making progress) for it to restore the workspace meanwhile.
        Path(ctx.params["judged_file"]).write_text(ctx.task_id)
        deadline = time.monotonic() + 20
        while not Path(ctx.params["go_file"]).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
            ctx.progress()
        files = sorted(p.name for p in ctx.workdir.iterdir() if not p.name.startswith("."))
        body = "\n".join(f"--- {name}\n{(ctx.workdir / name).read_text()}" for name in files)
        return ctx.effect("email", {"from": "ci@tenant.test", "to": "pypi@tenant.test",
                                    "subject": f"release {ctx.task_id}: {', '.join(files)}", "body": body})


# --- conversation threads, interleaved in the one global message sequence ------------------------------------
def logged_fold(previous: Any, messages: list[Any]) -> str:
    """The agent's summarizer: an extractive summary, and a line per fold in CRASHKIT_FOLD_LOG saying which
    messages it was handed (the peer's side of this attack)."""
    log_path = os.environ.get("CRASHKIT_FOLD_LOG")
    if log_path:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"seqs": [m.seq for m in messages],
                                 "threads": sorted({str(m.metadata.get("thread")) for m in messages})}) + "\n")
    lines = [previous.content] if previous else []
    return "\n".join(lines + [f"{m.role}: {m.content[:60]}" for m in messages])


threads = Agent("ck_threads", summarize=logged_fold)


@threads.step
def converse(ctx: Context) -> Any:
    """Per task: `busy` short messages on the thread `busy_thread`, with one long message of each quiet thread between
    them, so consecutive messages of a quiet thread lie hundreds of sequence numbers apart."""
    busy, quiet = int(ctx.params.get("busy", 0)), list(ctx.params.get("quiet", []))
    busy_thread = str(ctx.params.get("busy_thread", "busy"))
    every, written = max(1, busy // max(1, len(quiet))), 0
    for i in range(busy):
        if quiet and i % every == 0:
            name = quiet.pop(0)
            ctx.memory.in_thread(name).append("user", f"{name} {ctx.task_id} " + "words " * 40, {"thread": name})
            written += 1
        ctx.memory.in_thread(busy_thread).append("user", f"busy {i}", {"thread": busy_thread})
        written += 1
    return {"written": written}


# --- a step whose result cannot be stored as JSON ----------------------------------------------------------
nan = Agent("ck_nan")


@nan.step
def score(ctx: Context) -> Any:
    return {"score": float("nan")}  # e.g. a model's mean over an empty batch


@nan.step
def publish(ctx: Context) -> Any:
    return True


AGENTS = {"ck_pay": pay, "ck_mail": mail, "ck_release": ReleaseAgent(), "ck_threads": threads, "ck_nan": nan}
