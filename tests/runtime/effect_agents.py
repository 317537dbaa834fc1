"""Agents for the never-twice tests (AGENT_APP=tests.runtime.effect_agents:AGENTS): one payment, one email,
a scan-then-release task whose release step can be held while a test restores the workspace under it, and a
follower that schedules its own follow-up (`ctx.schedule`, tests/schedules/test_schedules_agent.py), and a drafter whose
step writes into its working directory and can be held (tests/runtime/test_rollback_workdir.py)."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from agent_runtime.sdk import Agent, Context

payer = Agent("payer")


@payer.step
def pay(ctx: Context) -> Any:
    return ctx.effect("payment", {"amount": 4200, "currency": "EUR", "to": f"acct_{ctx.task_id[:8]}"})["id"]


mailer = Agent("mailer")


@mailer.step
def send(ctx: Context) -> Any:
    return ctx.effect("email", {"from": "agent@t", "to": "ada@t", "subject": f"report {ctx.task_id}",
                                "body": "the report"})["message_id"]


releaser = Agent("releaser")


@releaser.step
def receive(ctx: Context) -> Any:
    """The customer's upload, infected; kept as a snapshot (what a later restore brings back)."""
    (ctx.workdir / "upload.bin").write_text("X5O!P%@AP[4\\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE")
    return ctx.snapshot_workspace()


@releaser.step
def scan(ctx: Context) -> Any:
    """Cleans the upload and records the verdict on the cleaned files."""
    (ctx.workdir / "upload.bin").write_text("clean contents")
    return ctx.judge("scan", True, {"engine": "test"}).id


@releaser.step
def release(ctx: Context) -> Any:
    """Requires the verdict, then (held while `hold_file` exists) sends the files it was given for."""
    ctx.require_judgment("scan")
    while Path(ctx.params["hold_file"]).exists():
        time.sleep(0.05)
        ctx.progress()
    files = {p.name: p.read_text() for p in sorted(ctx.workdir.iterdir()) if p.is_file()}
    return ctx.effect("email", {"from": "agent@t", "to": "customer@t", "subject": f"release {ctx.task_id}",
                                "body": repr(files)})["message_id"]


AGENTS = {"payer": payer, "mailer": mailer, "releaser": releaser}


follower = Agent("follower")


@follower.step
def plan(ctx: Context) -> Any:
    """Schedules its own follow-up in an hour, then (held while `hold_file` exists) ends the step: a kill
    anywhere in it replays the step, and with it the `ctx.schedule` call."""
    made = ctx.schedule(at=timedelta(hours=1), kind="followup", params={"invoice": ctx.params["invoice"]})
    while Path(ctx.params["hold_file"]).exists():
        time.sleep(0.05)
        ctx.progress()
    return made["id"]


AGENTS["follower"] = follower


drafter = Agent("drafter")


@drafter.step
def draft(ctx: Context) -> Any:
    """A message's run that writes a draft into its working directory, then (held while `hold_file` exists) goes
    on thinking: a new message with `rollback` lands while it is in this step."""
    (ctx.workdir / "draft.txt").write_text(f"draft of {ctx.params['question']}")
    while Path(ctx.params["hold_file"]).exists():
        time.sleep(0.05)
        ctx.progress()
    return "drafted"


AGENTS["drafter"] = drafter
