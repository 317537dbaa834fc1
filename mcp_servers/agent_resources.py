"""The resources of the customer's agent as an MCP server: a thread's messages and a task's result.

Two URI templates, read with the selectors the REST API reads with (``conversations.selectors``), so a resource is
exactly what ``GET /api/v1/tenants/{id}/threads/{thread}/messages`` and ``GET .../tasks/{task_id}`` answer:

- ``thread://{thread}/messages{?limit}``: the newest ``limit`` messages (default 50, at most 200), oldest first;
- ``task://{task_id}``: the task's status, parameters and, once done, its ``result`` (the last step's output).

Scoped as the tools are: every read goes to the token's own tenant's instance (another tenant's thread or task is
unknown there: "resource not found", never data), and needs the scope its REST twin needs (``conversations:read``
for a thread, ``tasks:read`` for a task). A read is a read: it is not queued in the inbox and does not wake an
instance; while the instance cannot answer the read is an error the client may retry. ``resources/list`` names the
tenant's recent tasks when the instance answers (empty otherwise: the templates are how a client finds the rest).
No HTTP here (the view is ``api.endpoint``); each function raises ``RpcError`` for the JSON-RPC error answer.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any
from urllib.parse import parse_qs, urlsplit

from controlplane.errors import ApplicationError
from conversations.selectors import task_detail, task_list, thread_messages
from tenants.choices import TokenScope
from tenants.models import Tenant

from .jsonrpc import FORBIDDEN, INTERNAL_ERROR, INVALID_PARAMS, RpcError

__all__ = ["LISTED_TASKS", "resource_read", "resource_templates", "resources_list"]

THREAD_SCHEME, TASK_SCHEME = "thread", "task"
JSON = "application/json"
LISTED_TASKS = 20  # resources/list: the newest tasks, a hint; older ones are read by their id

_TEMPLATES = [
    {"uriTemplate": "thread://{thread}/messages{?limit}", "name": "thread-messages", "title": "A thread's messages",
     "description": "The newest messages of a conversation thread (limit 1-200, default 50), oldest first, as "
                    "JSON: {thread, messages: [{seq, role, content, task, created_at, ...}], prev, next}. "
                    "Needs conversations:read.",
     "mimeType": JSON},
    {"uriTemplate": "task://{task_id}", "name": "task-result", "title": "A task and its result",
     "description": "A task's status, parameters and, once done, its result (the last step's output), as JSON: "
                    "{task_id, status, result, task}. Needs tasks:read.",
     "mimeType": JSON},
]


def resource_templates() -> list[dict[str, Any]]:
    return [dict(t) for t in _TEMPLATES]


def resources_list(tenant: Tenant, scopes: Collection[str]) -> list[dict[str, Any]]:
    """The tenant's newest tasks as ``task://`` resources. Empty while its instance cannot answer (asleep, down):
    a listing is a hint, and an error here would end the session of a client that lists on connect."""
    if TokenScope.TASKS_READ not in scopes:
        return []
    try:
        tasks = task_list(tenant=tenant, limit=LISTED_TASKS).get("tasks") or []
    except ApplicationError:
        return []
    return [{"uri": f"{TASK_SCHEME}://{t['id']}", "name": f"task-{t['id']}", "mimeType": JSON,
             "title": f"{t.get('kind')} task ({t.get('status')})"}
            for t in tasks if isinstance(t, dict) and t.get("id")]


def _need(scopes: Collection[str], scope: str) -> None:
    if scope not in scopes:
        raise RpcError(FORBIDDEN, f"this token lacks the scope {scope}", {"scope": str(scope)})


def _refused(uri: str, exc: ApplicationError) -> RpcError:
    """The selector's refusal as the JSON-RPC error a client can act on: unknown (here, another tenant's) or invalid
    is invalid params, as MCP says of an unknown resource; anything else (suspended, not provisioned, the instance
    down) carries the REST status, so a client can tell a retry from a refusal."""
    if exc.status_code == 404:
        return RpcError(INVALID_PARAMS, "resource not found", {"uri": uri})
    if exc.status_code == 400:
        return RpcError(INVALID_PARAMS, exc.detail, {"uri": uri})
    data: dict[str, Any] = {"uri": uri, "status": exc.status_code}
    if isinstance(exc.extra.get("code"), str):
        data["code"] = exc.extra["code"]
    return RpcError(INTERNAL_ERROR, exc.detail, data)


def _contents(uri: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"contents": [{"uri": uri, "mimeType": JSON, "text": json.dumps(body, default=str)}]}


def resource_read(tenant: Tenant, scopes: Collection[str], uri: object) -> dict[str, Any]:
    """The ``resources/read`` result for ``uri`` of ``tenant``'s agent."""
    if not isinstance(uri, str) or len(uri) > 1000:
        raise RpcError(INVALID_PARAMS, "uri must be a string of at most 1000 characters")
    parts = urlsplit(uri)
    query = parse_qs(parts.query)
    try:
        if parts.scheme == THREAD_SCHEME and parts.path == "/messages":
            _need(scopes, TokenScope.CONVERSATIONS_READ)
            limit = query.get("limit", [None])[-1]
            return _contents(uri, thread_messages(tenant=tenant, thread=parts.netloc, limit=limit))
        if parts.scheme == TASK_SCHEME and parts.path in ("", "/") and not parts.query:
            _need(scopes, TokenScope.TASKS_READ)
            answer = task_detail(tenant=tenant, task_id=parts.netloc)
            task = answer.get("task") if isinstance(answer.get("task"), dict) else None
            return _contents(uri, {"task_id": parts.netloc, "status": None if task is None else task.get("status"),
                                   "result": answer.get("result"), "task": task})
    except ApplicationError as exc:
        raise _refused(uri, exc) from None
    raise RpcError(INVALID_PARAMS, "resource not found", {"uri": uri[:1000]})
