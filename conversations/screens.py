"""What the portal and the staff dashboard show of one tenant's agent: its chat, tasks, task detail and log.

Shared by ``portal.conversation_views`` and ``dashboard.conversation_views``: both check who may see the
tenant first, then call these. Reads go through ``conversations.selectors`` and writes through
``conversations.services``; nothing here talks to an instance itself. An instance that cannot answer
(stopped, restarting, recovering) is a notice on the page, not an error page: what the control plane
holds (the durable inbox) is still shown. No permission checks here.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages as flash
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import redirect

from controlplane.errors import ApplicationError, NotFound, ValidationFailed
from conversations.choices import CANCELLABLE_TASK_STATUSES, InboxKind, InboxStatus, LogLevel, TaskStatus, ThreadPolicy
from conversations.models import InboxItem
from conversations.selectors import inbox_message_get, log_search, task_detail, task_list, thread_messages
from conversations.services import THREAD_RE, message_send, task_cancel, task_retry, thread_policy
from conversations.streams import reply_events
from instances.client import InstanceProblem, InstanceUnavailable
from tenants.actors import Actor
from tenants.choices import TenantStatus
from tenants.models import Tenant
from usage.pricing import PriceBook, format_usd, price_book

__all__ = ["DEFAULT_THREAD", "POLICY_LABELS", "REPLY_WAIT_S", "AgentRead", "chat_context", "thread_from",
           "message_post", "reply_stream", "CHAT_STATUSES", "tasks_context", "task_context", "task_retry_post",
           "task_cancel_post", "task_cancel_confirmed", "task_cancel_confirm_context", "CANCEL_CONFIRM_FIELD",
           "logs_context", "OPEN_EFFECT_STATES", "LOG_FOLLOW_S"]

# One thread per customer for the portal's chat panel (the tenant is the customer); the dashboard opens the
# same thread by default so staff see what the operator's users see, and can open any other by name.
DEFAULT_THREAD = "portal"
# A reply stream waits this long for a message still in the inbox, then ends (``timeout``); the page's
# EventSource reconnects by itself, so a short wait only costs a reconnect and frees the server thread.
REPLY_WAIT_S = 25.0
# Sent first on every reply stream: how soon the browser reconnects after the stream ends or breaks.
RECONNECT_MS = 1000
CHAT_MESSAGES = 50
TASK_PAGE = 50
# How often a log page in follow mode asks for the records after the newest it shows (htmx polling, as the
# other live parts of the screens): each poll reads a short tail of the instance (selectors.LOG_FOLLOW_WINDOW).
LOG_FOLLOW_S = 3
LOG_QUERY_MAX = 200
OPEN_EFFECT_STATES = ("in_doubt", "blocked")
# A tenant whose agent can be talked to (now, or through the inbox once it is back).
CHAT_STATUSES = frozenset({TenantStatus.READY, TenantStatus.DEGRADED, TenantStatus.RECOVERING})


@dataclass
class AgentRead:
    """A read from the instance: its data, or the reason it could not be read (shown as a notice)."""

    data: dict[str, Any] = field(default_factory=dict)
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


def _read(fn: Callable[..., dict[str, Any]], **kwargs: Any) -> AgentRead:
    try:
        return AgentRead(data=fn(**kwargs))
    except InstanceUnavailable as exc:
        return AgentRead(problem=f"The agent is not reachable right now ({exc.detail}). It is shown again as "
                                 "soon as it is back; nothing sent to it is lost.")
    except InstanceProblem as exc:
        if exc.status_code == 404:
            raise Http404(exc.detail) from None
        return AgentRead(problem=f"The agent refused the request: {exc.detail}")
    except NotFound as exc:
        raise Http404(exc.detail) from None
    except ValidationFailed as exc:
        return AgentRead(problem=exc.detail)


def when(value: object) -> str:
    """An instance timestamp (ISO 8601 or Unix seconds) as ``YYYY-MM-DD HH:MM:SS`` UTC; '' for none."""
    if value in (None, ""):
        return ""
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(float(value), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    text = str(value).replace("T", " ")
    return text[:19]


def pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


# --- chat ------------------------------------------------------------------------------------------------


def thread_from(request: HttpRequest) -> str:
    thread = request.GET.get("thread", "") or DEFAULT_THREAD
    return thread if THREAD_RE.fullmatch(thread) else DEFAULT_THREAD


# What each thread policy does to a run still answering when a new message arrives, as the chat panel says it.
POLICY_LABELS = {
    ThreadPolicy.ENQUEUE: "enqueue: the new message waits until the agent has answered (default)",
    ThreadPolicy.REJECT: "reject: a new message is refused while the agent is answering",
    ThreadPolicy.INTERRUPT: "interrupt: the answer stops at its next step, keeping what it did; the new message "
                            "is answered",
    ThreadPolicy.ROLLBACK: "rollback: the answer's unfinished work is discarded and the new message answered "
                           "(a payment or email already made is never undone)",
}


def chat_context(*, tenant: Tenant, thread: str, send_url: str, reply_url: Callable[[str], str],
                 can_send: bool, policy_url: str = "") -> dict[str, Any]:
    """The chat panel: the thread's latest messages, the ones still waiting in the inbox, the send form, and the
    thread's policy (a form to change it when ``policy_url`` is given).

    ``reply_url(message_id)`` is where the page reads a reply's stream; the last question without an
    answer gets one, so a page opened (or reloaded) while the agent is answering picks the reply up.
    """
    try:
        read = AgentRead(data=thread_messages(tenant=tenant, thread=thread, limit=CHAT_MESSAGES))
    except InstanceProblem as exc:
        read = AgentRead() if exc.status_code == 404 else AgentRead(problem=f"The agent refused: {exc.detail}")
    except InstanceUnavailable:
        read = AgentRead(problem="The agent is not reachable right now; messages sent now wait for it and are "
                                 "answered when it is back.")
    shown = [{"role": m.get("role", ""), "content": m.get("content", ""), "id": m.get("message_id") or "",
              "task": m.get("task") or "", "at": when(m.get("created_at"))} for m in read.data.get("messages", [])]
    answered = {m["task"] for m in shown if m["role"] == "assistant"}
    seen = {m["id"] for m in shown if m["id"]}
    waiting = (InboxItem.objects.filter(tenant=tenant, kind=InboxKind.MESSAGE, thread=thread,
                                        status=InboxStatus.PENDING).order_by("created_at")[:CHAT_MESSAGES])
    for item in waiting:
        if str(item.pk) not in seen:
            shown.append({"role": "user", "content": item.payload.get("content", ""), "id": str(item.pk),
                          "task": str(item.pk), "at": item.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                          "queued": True})
    pending = next((m for m in reversed(shown) if m["role"] == "user" and m["id"] and m["id"] not in answered),
                   None)
    return {"thread": thread, "messages": shown, "problem": read.problem, "send_url": send_url,
            "pending_reply_url": reply_url(pending["id"]) if pending else "", "pending_id": pending["id"] if pending
            else "", "idempotency_key": uuid.uuid4().hex, "can_send": can_send, "default_thread": DEFAULT_THREAD,
            "policy": thread_policy(tenant=tenant, thread=thread), "policy_url": policy_url,
            "policies": list(POLICY_LABELS.items())}


def message_post(request: HttpRequest, *, tenant: Tenant, thread: str, actor: Actor, key_prefix: str,
                 reply_url: Callable[[str], str], back_url: str) -> HttpResponse:
    """Send a message: JSON for the page's script (``Accept: application/json``), a redirect for a plain form.

    The page generates the Idempotency-Key (header, or the form's ``idempotency_key`` field) once per
    message and reuses it for every retry, so a retried send never appends a second message.
    """
    wants_json = "application/json" in request.headers.get("Accept", "")
    key = request.headers.get("Idempotency-Key") or request.POST.get("idempotency_key") or ""
    try:
        accepted = message_send(tenant=tenant, thread=thread, content=request.POST.get("content", ""),
                                idempotency_key=f"{key_prefix}:{key[:150]}" if key else None, actor=actor)
    except ApplicationError as exc:
        if wants_json:
            return JsonResponse({"status": exc.status_code, "detail": exc.detail}, status=exc.status_code)
        flash.error(request, f"Not sent: {exc.detail}")
        return redirect(back_url)
    item = accepted.item
    if item.status == InboxStatus.REFUSED:
        problem = item.response or {}
        detail = str(problem.get("detail") or "the agent refused this message")
        if wants_json:
            return JsonResponse({"status": int(problem.get("status") or 409), "detail": detail,
                                 "id": str(item.pk)}, status=int(problem.get("status") or 409))
        flash.error(request, f"Not sent: {detail}")
        return redirect(back_url)
    if wants_json:
        code = 202 if item.status == InboxStatus.PENDING else (201 if accepted.created else 200)
        return JsonResponse({"id": str(item.pk), "thread": item.thread, "status": item.status,
                             "created": accepted.created, "reply_url": reply_url(str(item.pk))}, status=code)
    flash.success(request, "Sent. The reply appears here once the agent has answered (reload the page).")
    return redirect(back_url)


def reply_stream(*, tenant: Tenant, thread: str, message_id: str) -> StreamingHttpResponse:
    """The reply's server-sent events, proxied from the instance (``conversations.streams``).

    The stream always ends on its own (``end``, ``timeout`` or ``interrupted`` when the instance went
    away) and the response closes, so the browser's EventSource reconnects after ``retry`` and the next
    stream picks the reply up; a committed reply is sent at once.
    """
    try:
        item = inbox_message_get(tenant=tenant, thread=thread, message_id=message_id)
    except (NotFound, ValidationFailed):
        raise Http404("message not found") from None

    def events() -> Iterator[bytes]:
        yield f"retry: {RECONNECT_MS}\n\n".encode()
        yield from reply_events(tenant=tenant, item=item, wait_s=REPLY_WAIT_S)

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


# --- tasks and logs --------------------------------------------------------------------------------------


def tasks_context(request: HttpRequest, *, tenant: Tenant, task_url: Callable[[str], str]) -> dict[str, Any]:
    status = request.GET.get("status", "")
    status = status if status in TaskStatus.values else ""
    before = request.GET.get("before", "")
    read = _read(task_list, tenant=tenant, status=status or None, limit=TASK_PAGE, before=before or None)
    rows = [{**t, "url": task_url(str(t.get("id", ""))), "created": when(t.get("created_at")),
             "updated": when(t.get("updated_at"))} for t in read.data.get("tasks", [])]
    return {"read": read, "tasks": rows, "status": status, "statuses": TaskStatus.values, "before": before,
            "next": read.data.get("next") or ""}


def task_context(*, tenant: Tenant, task_id: str,
                 decide_url: Callable[[dict[str, Any]], str] | None = None,
                 retry_url: str | None = None, cancel_url: str | None = None) -> dict[str, Any]:
    """One task: summary (a blocked reason in words, with the action that clears it), steps with timings and
    their last error, case file, effects (with a decide link where allowed), result, and the Retry and Cancel
    forms' targets when the viewer may act and the task's status allows each (the instance would answer 409
    otherwise, so the page does not offer a button that can only fail)."""
    read = _read(task_detail, tenant=tenant, task_id=task_id)
    d = read.data
    task = dict(d.get("task") or {})
    task.setdefault("retryable", False)
    steps = [{**s, "started": when(s.get("started_at")), "finished": when(s.get("finished_at"))}
             for s in d.get("steps", [])]
    effects = [{**e, "created": when(e.get("created_at")), "settled": when(e.get("settled_at")),
                "result_json": pretty(e.get("result")) if e.get("result") is not None else "",
                "resolution_json": pretty(e.get("resolution")) if e.get("resolution") else "",
                "decide_url": decide_url(e) if decide_url and e.get("state") in OPEN_EFFECT_STATES else ""}
               for e in d.get("effects", [])]
    case = d.get("case_file") or {}
    trace = trace_rows(list(d.get("spans") or []), prices=price_book(tenant.operator_id))
    return {"read": read, "task_id": task_id, "task": task, "steps": steps, "effects": effects,
            "case_file": case, "has_case_file": any(case.get(k) for k in ("done", "waiting_on", "ruled_out", "notes")),
            "judgments": [{**j, "created": when(j.get("created_at"))} for j in d.get("judgments", [])],
            "params_json": pretty(task.get("params")) if task.get("params") else "",
            "result_json": pretty(d.get("result")) if d.get("result") is not None else "",
            "created": when(task.get("created_at")), "updated": when(task.get("updated_at")),
            "retry_url": retry_url if retry_url and task.get("retryable") else "", "retry_key": uuid.uuid4().hex,
            "cancel_url": cancel_url if cancel_url and task.get("status") in CANCELLABLE_TASK_STATUSES else "",
            "trace": trace, "trace_cost": trace_cost(trace)}


def _lever_post(request: HttpRequest, *, service: Callable[..., Any], verb: str, noun: str, done: str, tenant: Tenant,
                task_id: str, actor: Actor, key_prefix: str, back_url: str) -> HttpResponse:
    """A task lever's button (Retry, Cancel): call the service the API's endpoint calls (audited, through the
    inbox) and say on the task page what happened. The form carries an idempotency key generated with the
    page, so a double click is one request."""
    key = request.POST.get("idempotency_key", "")
    try:
        accepted = service(tenant=tenant, task_id=task_id, actor=actor,
                           idempotency_key=f"{key_prefix}:{key[:150]}" if key else None)
    except ApplicationError as exc:
        flash.error(request, f"Not {verb}: {exc.detail}")
        return redirect(back_url)
    item = accepted.item
    if item.status == InboxStatus.REFUSED:
        flash.error(request, f"Not {verb}: " + str((item.response or {}).get("detail") or "the agent refused"))
    elif item.status == InboxStatus.PENDING:
        flash.info(request, f"The instance is not reachable; the {noun} waits in the inbox and is delivered as "
                            "soon as it is back.")
    else:
        flash.success(request, done)
    return redirect(back_url)


# What a span shows as its inputs and outputs, by attribute (GenAI conventions and the runtime's own).
_SPAN_INPUTS = ("gen_ai.input.messages", "gen_ai.tool.call.arguments", "agent.effect.arguments")
_SPAN_OUTPUTS = ("gen_ai.output.messages", "gen_ai.tool.call.result", "agent.effect.result", "agent.step.output")


def trace_rows(spans: list[dict[str, Any]], *, prices: PriceBook | None = None) -> list[dict[str, Any]]:
    """The instance's spans of a task (`GET /v1/tasks/{id}`'s ``spans``) in tree order, each with its depth, its
    offset from the first span's start, its tokens and their cost (``prices``: the tenant's operator's), and its
    inputs/outputs and other attributes for the table. A span whose parent is not kept (a task over its span cap)
    is drawn at the top level."""
    parsed = []
    for sp in spans:
        try:
            start = dt.datetime.fromisoformat(str(sp["started_at"]))
        except (KeyError, ValueError):
            continue
        parsed.append((start, sp))
    if not parsed:
        return []
    origin = min(start for start, _ in parsed)
    ids = {sp.get("span_id") for _, sp in parsed}
    children: dict[str | None, list[tuple[dt.datetime, dict[str, Any]]]] = {}
    for start, sp in sorted(parsed, key=lambda p: p[0]):
        parent = sp.get("parent_span_id") if sp.get("parent_span_id") in ids else None
        children.setdefault(parent, []).append((start, sp))
    rows: list[dict[str, Any]] = []

    def walk(parent: str | None, depth: int) -> None:
        for start, sp in children.get(parent, []):
            attrs = dict(sp.get("attributes") or {})
            tokens_in, tokens_out = attrs.get("gen_ai.usage.input_tokens"), attrs.get("gen_ai.usage.output_tokens")
            tokens = (int(tokens_in or 0) + int(tokens_out or 0)) if (tokens_in or tokens_out) else None
            model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")
            cost = prices.cost((attrs.get("gen_ai.response.model"), attrs.get("gen_ai.request.model")),
                               int(tokens_in or 0), int(tokens_out or 0)) if tokens and prices else None
            rows.append({"model": model, "cost": cost, "cost_text": format_usd(cost) if cost is not None else "",
"name": str(sp.get("name", "")), "depth": min(depth, 8), "status": sp.get("status"),
                         "offset_ms": (start - origin).total_seconds() * 1000,
                         "duration_ms": float(sp.get("duration_ms") or 0.0), "tokens": tokens,
                         "tokens_in": tokens_in, "tokens_out": tokens_out,
                         "checkpoint": attrs.get("agent.checkpoint_id"),
                         "inputs": [(k, _pretty_text(attrs[k])) for k in _SPAN_INPUTS if k in attrs],
                         "outputs": [(k, _pretty_text(attrs[k])) for k in _SPAN_OUTPUTS if k in attrs],
                         "attributes": sorted((k, v) for k, v in attrs.items()
                                              if k not in _SPAN_INPUTS and k not in _SPAN_OUTPUTS)})
            if depth < 64:
                walk(str(sp.get("span_id")), depth + 1)

    walk(None, 0)
    return rows


def trace_cost(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The task's model cost: the sum of its priced spans (exact), and the models with tokens but no price, which
    the total leaves out and says so (an unknown price is never guessed)."""
    priced = [r["cost"] for r in rows if r.get("cost") is not None]
    unpriced = sorted({str(r.get("model") or "unnamed model")
                       for r in rows if r.get("tokens") and r.get("cost") is None})
    total = sum(priced, Decimal(0))
    return {"total": total, "total_text": format_usd(total) if priced else "", "unpriced": unpriced,
            "spans": len(priced)}


def _pretty_text(value: Any) -> str:
    """A recorded input/output (JSON text, already redacted by the instance) indented for reading."""
    try:
        return pretty(json.loads(value)) if isinstance(value, str) else pretty(value)
    except ValueError:
        return str(value)


def task_retry_post(request: HttpRequest, *, tenant: Tenant, task_id: str, actor: Actor, key_prefix: str,
                    back_url: str) -> HttpResponse:
    """The Retry button: ``conversations.services.task_retry``, as ``POST .../tasks/{id}/retry``."""
    return _lever_post(request, service=task_retry, verb="retried", noun="retry", tenant=tenant, task_id=task_id,
                       actor=actor, key_prefix=key_prefix, back_url=back_url,
                       done="Retried: the task runs again from its last checkpoint.")


# The confirm step's field: only a POST that carries it cancels. Cancelling cannot be undone, and the CSP forbids
# the inline script a browser confirm() would need, so the step is a page rendered on the server.
CANCEL_CONFIRM_FIELD = "confirm"


def task_cancel_confirmed(request: HttpRequest) -> bool:
    """Whether this request is the confirm page's POST (a GET, or a POST without the field, only asks)."""
    return request.method == "POST" and request.POST.get(CANCEL_CONFIRM_FIELD) == "yes"


def task_cancel_confirm_context(*, tenant: Tenant, task_id: str, cancel_url: str, back_url: str) -> dict[str, Any]:
    """The page between the Cancel button and the cancel: the task as the instance sees it now, and what
    cancelling does. Its form carries the confirm field and an idempotency key generated with the page, so a
    double click on the confirm is still one cancel."""
    read = _read(task_detail, tenant=tenant, task_id=task_id)
    task = dict(read.data.get("task") or {})
    return {"read": read, "task_id": task_id, "task": task, "cancel_url": cancel_url, "back_url": back_url,
            "cancel_key": uuid.uuid4().hex, "confirm_field": CANCEL_CONFIRM_FIELD,
            "cancellable": not task or task.get("status") in CANCELLABLE_TASK_STATUSES}


def task_cancel_post(request: HttpRequest, *, tenant: Tenant, task_id: str, actor: Actor, key_prefix: str,
                     back_url: str) -> HttpResponse:
    """The confirm page's Cancel: ``conversations.services.task_cancel``, as ``POST .../tasks/{id}/cancel``."""
    return _lever_post(request, service=task_cancel, verb="cancelled", noun="cancel", tenant=tenant, task_id=task_id,
                       actor=actor, key_prefix=key_prefix, back_url=back_url,
                       done="Cancelled: the task stops for good (effects already committed are not undone).")


def _log_read(**kwargs: Any) -> dict[str, Any]:
    return {"log": log_search(**kwargs)}


def logs_context(request: HttpRequest, *, tenant: Tenant, task_url: Callable[[str], str],
                 logs_url: str) -> dict[str, Any]:
    """The log screen (newest first, ``q`` search, lowest ``level``, pages; ``follow=1`` polls for newer records)
    or, with ``since``, only the records after it: the follow poll's answer (``partial`` is then true and the
    view renders ``ui/agent/_log_follow.html``). Filtering, ordering and paging are
    ``conversations.selectors.log_search``'s; this only reads the request and makes links."""
    level = request.GET.get("level", "")
    level = level if level in LogLevel.values else ""
    q = request.GET.get("q", "").strip()[:LOG_QUERY_MAX]
    since = request.GET.get("since", "")
    partial = bool(since)
    read = _read(_log_read, tenant=tenant, q=q, level=level or None, page=request.GET.get("page", 1),
                 since=since or None)
    found = read.data.get("log")
    records = [{**r, "at": when(r["ts"]) if r["ts"] is not None else "",
                "task_url": task_url(r["task_id"]) if r["task_id"] else ""}
               for r in (found.page.object_list if found else [])]
    follow = partial or (request.GET.get("follow") == "1" and (found is None or found.page.number == 1))
    newest = found.newest_ts if found and found.newest_ts is not None else (since or None)
    filters = {k: v for k, v in (("q", q), ("level", level)) if v}
    follow_url = logs_url + "?" + urlencode({**filters, "follow": "1", "since": newest or 0})
    return {"read": read, "records": records, "page": found.page if found else None, "q": q, "level": level,
            "levels": LogLevel.values, "follow": follow, "follow_url": follow_url, "follow_s": LOG_FOLLOW_S,
            "partial": partial, "window_full": bool(found and found.window_full),
            "searched": found.searched if found else 0,
            "query": urlencode({**filters, **({"follow": "1"} if follow else {})}) + "&" if filters or follow
            else ""}
