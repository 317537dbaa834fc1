"""The demo agents, written on the public SDK only.

`demo`: plan -> search (slow, cached tool) -> write files -> scan (judgment bound to the workspace digest)
-> send email (gated on the scan, through the ledger) -> pay (through the ledger) -> snapshot.
`forward`: mail forwarding that re-checks its credential at the moment of use.

Task parameters: `topic`, `amount`, `payee`, `to`, `cc` (one more email per address, in the same step),
`malware` (plant a file the scan rejects), `regenerate_args` (fresh payment arguments on every run, to show
the key does not follow them); `search_s` and `step_sleep_s` simulate latency (capped at 5 s).
Agent configuration (AGENT_CONFIG): `planner` ("deterministic" or "openai" with `llm_url`, `llm_model`).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from agent_examples.planner import DeterministicPlanner, OpenAIChatPlanner, Planner
from agent_runtime.sdk import Context, Step, TaskBlocked

__all__ = ["AGENTS", "DemoAgent", "ForwardAgent", "planner_for", "slow_search"]

MAX_SIMULATED_S = 5.0

MALWARE_MARKER = "X5O!P%@AP[4\\PZX54(P^)7CC)7}$EICAR"


def slow_search(query: str, latency_s: float) -> dict[str, Any]:
    """The "paid" search tool: every call is billed (logged) when it starts."""
    log_path = os.environ.get("AGENT_DEMO_SEARCH_LOG")
    if log_path:
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"q": query, "t": time.time(), "pid": os.getpid()}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    time.sleep(latency_s)
    return {"q": query, "results": [f"{query}: finding {i}" for i in range(3)]}


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.chmod(mode)
    os.replace(tmp, path)


def _latency(ctx: Context, name: str, default: float = 0.0) -> float:
    return max(0.0, min(MAX_SIMULATED_S, float(ctx.params.get(name, default))))


def _pause(ctx: Context) -> None:
    time.sleep(_latency(ctx, "step_sleep_s"))


def planner_for(ctx: Context) -> Planner:
    if ctx.config.get("planner") == "openai":
        return OpenAIChatPlanner(str(ctx.config["llm_url"]), str(ctx.config.get("llm_model", "gpt-4o-mini")),
                                 ctx.credentials)
    return DeterministicPlanner()


class DemoAgent:
    kind = "demo"

    def steps(self, params: dict[str, Any]) -> list[Step]:
        return [Step("plan", self.plan), Step("search", self.search), Step("write_files", self.write_files),
                Step("scan", self.scan), Step("send_email", self.send_email), Step("pay", self.pay),
                Step("snapshot", self.snapshot)]

    def plan(self, ctx: Context) -> Any:
        _pause(ctx)
        topic = str(ctx.params.get("topic", "heat pumps"))
        queries = planner_for(ctx).plan_queries(topic)
        ctx.delta.notes["queries"] = queries
        ctx.memory.append("assistant", f"Plan for {topic}: " + "; ".join(queries), {"task": str(ctx.task.id)})
        return {"queries": len(queries)}

    def search(self, ctx: Context) -> Any:
        latency = _latency(ctx, "search_s", 0.05)
        found = 0
        for q in ctx.case.notes["queries"]:
            res = ctx.tool("search", {"q": q}, lambda q=q: slow_search(q, latency))
            found += len(res["results"])
            ctx.progress({"query": q})
        _pause(ctx)
        return {"results": found}

    def write_files(self, ctx: Context) -> Any:
        topic = str(ctx.params.get("topic", "heat pumps"))
        findings: list[str] = []
        for q in ctx.case.notes["queries"]:
            findings += ctx.tool("search", {"q": q}, lambda q=q: slow_search(q, 0.0))["results"]
        _write_atomic(ctx.workdir / "report.md", planner_for(ctx).write_summary(topic, findings))
        _write_atomic(ctx.workdir / "data.json", json.dumps({"topic": topic, "findings": findings}, indent=1))
        if ctx.params.get("malware"):
            _write_atomic(ctx.workdir / "payload.bin", MALWARE_MARKER)
        _pause(ctx)
        return {"files": sorted(p.name for p in ctx.workdir.iterdir() if not p.name.startswith("."))}

    def scan(self, ctx: Context) -> Any:
        infected = sorted(p.name for p in ctx.workdir.rglob("*")
                          if p.is_file() and MALWARE_MARKER in p.read_text(errors="replace"))
        j = ctx.judge("scan", passed=not infected, detail={"infected": infected})
        if infected:
            ctx.delta.ruled_out["release"] = f"scan found {infected}"
        _pause(ctx)
        return {"passed": j.passed, "digest": j.artifact_digest}

    def send_email(self, ctx: Context) -> Any:
        ctx.require_judgment("scan")  # the release gate: only for files exactly as scanned
        ctx.credential("smtp")  # re-checked now; its value stays in memory
        report = (ctx.workdir / "report.md").read_text()
        res = ctx.effect("email", {"from": "agent@tenant.test", "to": ctx.params.get("to", "user@tenant.test"),
                                   "subject": f"Report {ctx.task.id}", "body": report})
        copies = [ctx.effect("email", {"from": "agent@tenant.test", "to": cc, "subject": f"Report {ctx.task.id}",
                                       "body": report})["message_id"] for cc in ctx.params.get("cc", [])]
        _pause(ctx)
        return {"message_id": res["message_id"], "copies": copies}

    def pay(self, ctx: Context) -> Any:
        args: dict[str, Any] = {"amount": int(ctx.params.get("amount", 1299)), "currency": "EUR",
                                "to": str(ctx.params.get("payee", "acct_demo"))}
        if ctx.params.get("regenerate_args"):
            # A replanned step may produce different arguments on every run; the key must not follow them.
            args["to"] = f"acct_{uuid.uuid4().hex[:8]}"
        res = ctx.effect("payment", args)
        _pause(ctx)
        return {"charge": res["id"]}

    def snapshot(self, ctx: Context) -> Any:
        return {"snapshot": ctx.snapshot_workspace()}


class ForwardAgent:
    """Forward the user's mail to an address, only while the 'mail-forwarding' credential is live."""

    kind = "forward"

    def steps(self, params: dict[str, Any]) -> list[Step]:
        return [Step("enable", self.enable), Step("wait", self.wait), Step("forward", self.forward)]

    def enable(self, ctx: Context) -> Any:
        ctx.credential("mail-forwarding")
        ctx.delta.notes["forwarding_to"] = ctx.params["forward_to"]
        return {"enabled": True}

    def wait(self, ctx: Context) -> Any:
        deadline = time.monotonic() + float(ctx.params.get("wait_s", 0.0))
        while time.monotonic() < deadline:
            time.sleep(0.05)
            ctx.progress()
        return True

    def forward(self, ctx: Context) -> Any:
        # The case file says forwarding is enabled; only the source of truth may say it still is.
        try:
            ctx.credential("mail-forwarding")
        except Exception as exc:
            raise TaskBlocked("credential_unavailable", f"mail forwarding no longer authorized: {exc}") from exc
        res = ctx.effect("email", {"from": "agent@tenant.test", "to": ctx.case.notes["forwarding_to"],
                                   "subject": "Fwd: inbox", "body": "forwarded mail"})
        return {"message_id": res["message_id"]}


demo = DemoAgent()
forward = ForwardAgent()
AGENTS = {"demo": demo, "forward": forward}
