"""The support agent: answers a customer's question with an OpenAI-compatible chat model that calls tools.

Task parameters: `thread` (the conversation: one per customer or case) and `question`.
Agent configuration (AGENT_CONFIG): `llm_url` (the API's base URL, e.g. https://api.openai.com/v1),
`llm_model`, `llm_credential` (the credential holding the API key, default "openai"), `orders` (order id ->
record: the table `lookup_order` reads), `kb` (a list of {"title", "text"}: what `search_kb` searches; a small
default), `helpdesk_email` (set it to offer the model `open_ticket`, the irreversible effect "ticket", whose
provider the instance configures in AGENT_EFFECTS: an SMTP relay to the helpdesk's intake address, an HTTP API
with Idempotency-Key or a signed webhook), `mcp_server` (the name of an MCP server the instance gets, e.g. one
registered for the customer: its allowed tools are offered to the model next to the built-in ones, a built-in
name winning, and each call goes where its kind belongs through `ctx.mcp`), `agent_email`, `history_tokens`
(2000), `max_tool_rounds` (4), `llm_timeout_s` (60), `system_prompt`.

Three steps, each safe to run again after a crash:
- remember: appends the question to the thread once (a re-run finds its own message by the task id in the
  message's metadata) and records which part of the thread the model sees, so every replay shows it the same;
- answer: the tool loop. Every completion goes through `ctx.tool("chat", ...)` and every tool the model calls
  through `ctx.tool` or, for a ticket, `ctx.effect`: a replay rebuilds the same conversation from recorded
  answers and pays only for the completion that was in flight when the instance died;
- reply: appends the answer to the thread once.
"""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

from agent_runtime.sdk import Agent, ChatModel, Context, TaskBlocked

__all__ = ["DEFAULT_KB", "TOOLS", "agent"]

DEFAULT_SYSTEM = ("You are a customer support agent. Use the tools to look up orders and the knowledge base; "
                  "open a ticket only when the customer needs a human (refunds, damaged goods). Answer briefly.")
DEFAULT_KB: tuple[dict[str, str], ...] = (
    {"title": "Returns", "text": "Items can be returned within 30 days of delivery for a full refund."},
    {"title": "Shipping times", "text": "Orders ship within 2 business days; delivery takes 3 to 5 days."},
    {"title": "Warranty", "text": "Every device has a 2-year warranty covering manufacturing defects."},
)
# How far back a re-run of remember/reply looks for the message it may already have written. The host resumes
# an interrupted task before any other, so its own message is at most a few turns from the tail.
REPLAY_SCAN = 200
PRIORITIES = ("low", "normal", "high")
MAX_QUESTION_CHARS = 8000

TOOLS: dict[str, dict[str, Any]] = {
    "lookup_order": {"type": "function", "function": {
        "name": "lookup_order", "description": "The status, carrier and delivery estimate of an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description":
                                                                     "the order number, e.g. 1042"}},
                       "required": ["order_id"]}}},
    "search_kb": {"type": "function", "function": {
        "name": "search_kb", "description": "Search the help-centre articles (returns, shipping, warranty).",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    "open_ticket": {"type": "function", "function": {
        "name": "open_ticket", "description": "Hand the case to a human agent. Irreversible: call it once.",
        "parameters": {"type": "object", "properties": {
            "summary": {"type": "string", "description": "one line for the human agent"},
            "priority": {"type": "string", "enum": list(PRIORITIES)}}, "required": ["summary"]}}},
}

agent = Agent("support", description="Answers customer questions with a chat model and tools (orders, "
                                     "knowledge base, helpdesk tickets).", conversational=True)


def _params(ctx: Context) -> tuple[str, str]:
    thread, question = ctx.params.get("thread"), ctx.params.get("question")
    if not isinstance(thread, str) or not 0 < len(thread) <= 200:
        raise TaskBlocked("bad_params", "'thread' must be a string of 1 to 200 characters")
    if not isinstance(question, str) or not question.strip() or len(question) > MAX_QUESTION_CHARS:
        raise TaskBlocked("bad_params", f"'question' must be a non-empty string of at most {MAX_QUESTION_CHARS} "
                                        "characters")
    return thread, question


def _own_message(ctx: Context, thread: str, turn: str) -> int | None:
    """The seq of the message this task already wrote for `turn`: the step ran before and died uncommitted."""
    for msg in reversed(ctx.memory.in_thread(thread).tail(REPLAY_SCAN)):
        if msg.metadata.get("task") == ctx.task_id and msg.metadata.get("turn") == turn:
            return msg.seq
    return None


def _model(ctx: Context) -> ChatModel:
    url = ctx.config.get("llm_url")
    if not url:
        raise TaskBlocked("agent_config", "AGENT_CONFIG has no 'llm_url' (the chat model's base URL)")
    return ChatModel(str(url), str(ctx.config.get("llm_model", "gpt-4o-mini")), credentials=ctx.credentials,
                     credential=str(ctx.config.get("llm_credential", "openai")),
                     timeout_s=float(ctx.config.get("llm_timeout_s", 60.0)))


def _mcp(ctx: Context) -> Any:
    """The MCP server the configuration names (`mcp_server`, one the instance gets under `mcp`), else None."""
    name = ctx.config.get("mcp_server")
    return ctx.mcp(str(name)) if name else None


def _tool_specs(ctx: Context, mcp: Any = None) -> list[dict[str, Any]]:
    names = ["lookup_order", "search_kb"] + (["open_ticket"] if ctx.config.get("helpdesk_email") else [])
    # The MCP server's tools join the built-in ones (a built-in name wins: the model keeps the tools it knows).
    extra = [t for t in mcp.tools() if t["function"]["name"] not in TOOLS] if mcp is not None else []
    return [TOOLS[n] for n in names] + extra


def _lookup_order(orders: Any, order_id: str) -> dict[str, Any]:
    record = orders.get(order_id) if isinstance(orders, dict) else None
    if not isinstance(record, dict):
        return {"order_id": order_id, "error": "no such order"}
    return {"order_id": order_id, **record}


def _search_kb(docs: Any, query: str, limit: int = 2) -> dict[str, Any]:
    """Word-overlap ranking: enough for a handful of articles; a large help centre belongs in semantic memory."""
    words = {w for w in re.findall(r"[a-z0-9]+", query.lower()) if len(w) > 2}
    scored = []
    for doc in docs if isinstance(docs, list | tuple) else DEFAULT_KB:
        if not isinstance(doc, dict):
            continue
        text = f"{doc.get('title', '')} {doc.get('text', '')}".lower()
        score = len(words & set(re.findall(r"[a-z0-9]+", text)))
        if score:
            scored.append((score, doc))
    scored.sort(key=lambda pair: -pair[0])
    return {"query": query, "results": [{"title": d.get("title", ""), "text": d.get("text", "")}
                                        for _s, d in scored[:limit]]}


def _open_ticket(ctx: Context, thread: str, question: str, args: dict[str, Any]) -> dict[str, Any]:
    priority = args.get("priority") if args.get("priority") in PRIORITIES else "normal"
    summary = " ".join(str(args.get("summary") or question).split())[:200]
    # The n-th ticket of this step keeps its key on every replay, whatever the model words it as this time.
    res = ctx.effect("ticket", {
        "from": str(ctx.config.get("agent_email", "agent@tenant.test")), "to": str(ctx.config["helpdesk_email"]),
        "subject": f"[support/{priority}] {summary}", "thread": thread, "priority": priority,
        "body": f"{summary}\n\nThread: {thread}\nTask: {ctx.task_id}\n\nThe customer wrote:\n{question}\n"})
    return {"opened": True, "priority": priority,
            "reference": res.get("message_id") or res.get("id") or res.get("webhook_id")}


def _run_tool(ctx: Context, thread: str, question: str, call: dict[str, Any], mcp: Any = None,
              mcp_names: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One tool call of the model. Results are cached under the task: a replay of this task sees what the
    model saw; the next question sees the order as it is then."""
    fn = call.get("function") or {}
    name = fn.get("name")
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        args = None
    if not isinstance(args, dict):
        return {"error": "the arguments must be a JSON object"}
    if name == "lookup_order":
        order_id = str(args.get("order_id", "")).strip().lstrip("#")
        return ctx.tool("lookup_order", {"task": ctx.task_id, "order_id": order_id},
                        lambda: _lookup_order(ctx.config.get("orders"), order_id))
    if name == "search_kb":
        query = str(args.get("query", ""))[:500]
        return ctx.tool("search_kb", {"task": ctx.task_id, "query": query},
                        lambda: _search_kb(ctx.config.get("kb"), query))
    if name == "open_ticket" and ctx.config.get("helpdesk_email"):
        return _open_ticket(ctx, thread, question, args)
    if mcp is not None and name in mcp_names:
        # Routed by the tool's kind: read-only from the cache, idempotent called, anything else the effect ledger.
        return dict(mcp.call(str(name), args))
    return {"error": f"there is no tool named {name!r}"}


@agent.step
def remember(ctx: Context) -> dict[str, Any]:
    """Append the question once; fix the window of the thread the model will be shown."""
    thread, question = _params(ctx)
    log = ctx.memory.in_thread(thread)
    seq = _own_message(ctx, thread, "question")
    if seq is None:
        seq = log.append("user", question, {"task": ctx.task_id, "turn": "question"})
    window = log.window(int(ctx.config.get("history_tokens", 2000)))
    shown = [m.seq for m in window.messages if m.seq <= seq]
    # The log is append-only, so (first seq, question seq) names the same messages on every replay.
    first = shown[0] if shown and shown[-1] == seq else seq
    return {"question_seq": seq, "history_from": first,
            "summary": window.summary.content if window.summary else None}


@agent.step(timeout_s=300)
def answer(ctx: Context) -> dict[str, Any]:
    """Call the model until it answers; the last round offers no tools, so the loop is bounded."""
    thread, question = _params(ctx)
    seen = ctx.case.steps_done["remember"]
    model = _model(ctx)
    messages: list[dict[str, Any]] = [{"role": "system", "content": str(ctx.config.get("system_prompt")
                                                                        or DEFAULT_SYSTEM)}]
    if seen.get("summary"):
        messages.append({"role": "system", "content": f"Summary of the conversation so far: {seen['summary']}"})
    messages += [{"role": m.role, "content": m.content}
                 for m in ctx.memory.in_thread(thread).range(seen["history_from"], seen["question_seq"])
                 if m.role in ("user", "assistant", "system")]
    mcp = _mcp(ctx)
    tools = _tool_specs(ctx, mcp)
    mcp_names = frozenset(t["function"]["name"] for t in tools if t["function"]["name"] not in TOOLS)
    rounds = max(1, int(ctx.config.get("max_tool_rounds", 4)))
    used: list[str] = []
    for n in range(rounds + 1):
        offer = tools if n < rounds else []
        prompt = list(messages)
        # The tokens are reported inside the cached call: a replay served from the cache reports none.
        said = ctx.tool("chat", {"task": ctx.task_id, "model": model.model, "messages": prompt, "tools": offer},
                        partial(model.complete, prompt, tools=offer, usage=ctx.usage))
        ctx.progress({"completion": n + 1})
        calls = said.get("tool_calls") or []
        if not calls:
            return {"content": str(said.get("content") or ""), "completions": n + 1, "tools": used}
        messages.append({"role": "assistant", "content": said.get("content"), "tool_calls": calls})
        for call in calls:
            used.append(str((call.get("function") or {}).get("name")))
            result = _run_tool(ctx, thread, question, call, mcp, mcp_names)
            # Sorted keys: a result read back from the cache must give the model (and the cache key) the same text.
            messages.append({"role": "tool", "tool_call_id": call.get("id"),
                             "content": json.dumps(result, sort_keys=True)})
    raise TaskBlocked("model_tool_loop", f"the model still asked for tools after {rounds} rounds and a last "
                                         "request without tools")


@agent.step
def reply(ctx: Context) -> dict[str, Any]:
    """Append the answer once (ctx.reply finds its own on a re-run)."""
    _params(ctx)
    done = ctx.case.steps_done["answer"]
    return {"seq": ctx.reply(done["content"], metadata={"tools": done["tools"]})}
