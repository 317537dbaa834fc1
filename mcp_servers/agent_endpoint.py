"""The customer's agent as an MCP server: JSON-RPC of the streamable HTTP transport, answered for one tenant.

No HTTP here (``api.endpoint`` is the view): ``mcp_answer`` takes one parsed JSON-RPC message and the caller's
tenant, actor and scopes, and returns the JSON-RPC response (None for a notification or a client's response).

The server is stateless: no session id, no server-to-client stream, every request answered with one JSON body. It
speaks the initialize handshake (protocol revisions 2025-03-26 to 2025-11-25); a client probing the 2026
``server/discover`` gets "method not found" and falls back to the handshake, as the spec's clients do.

Tools: one per agent kind of the tenant's release (``run_<kind>``: submit a task with its ``params``), plus
``send_message`` (a message into a thread) and ``get_task`` (a task's status and result). Each write goes through
the durable inbox (``conversations.services``), so an instance that is asleep or restarting still takes it: the
answer then says the task is queued and names its id. ``wait_s`` waits (at most ``MCP_ENDPOINT_WAIT_S``) for the
task to finish; past that the answer carries the task id for a later ``get_task``.

Resources (``agent_resources``): a thread's messages and a task's result, read for the same tenant.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any

from django.conf import settings

from controlplane.errors import ApplicationError
from conversations.choices import InboxStatus, TaskStatus
from conversations.selectors import task_detail
from conversations.services import message_send, task_submit
from instances.client import InstanceProblem, InstanceUnavailable
from releases.assignments import tenant_release_seen
from tenants.actors import Actor
from tenants.choices import TokenScope
from tenants.models import Tenant

from .agent_resources import resource_read, resource_templates, resources_list
from .jsonrpc import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, RpcError

__all__ = ["PROTOCOL_VERSIONS", "mcp_answer", "mcp_tools"]

# The handshake revisions this server speaks, oldest to newest; the newest is offered to a client asking another.
PROTOCOL_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
SERVER_INFO = {"name": "agent-control-plane", "version": "1"}
_FINISHED = {TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.INTERRUPTED,
             TaskStatus.ROLLED_BACK, TaskStatus.BLOCKED}
_POLL_S = 0.5
RUN_PREFIX = "run_"

_WAIT = {"type": "number", "minimum": 0, "description": "Seconds to wait for the task to finish (capped by the "
                                                        "server); 0 or absent: answer at once with the task id."}
_KEY = {"type": "string", "maxLength": 200, "description": "Idempotency key: the same key and arguments answer "
                                                           "with the same task, never a second one."}


def _kinds(tenant: Tenant) -> dict[str, str]:
    assignment = tenant_release_seen(tenant)
    release = assignment.release if assignment.release_id is not None else None
    return {str(k): str(v) for k, v in dict(release.kinds if release is not None else {}).items()}


def mcp_tools(tenant: Tenant) -> list[dict[str, Any]]:
    """The tools the tenant's agent offers, as MCP describes them."""
    tools: list[dict[str, Any]] = []
    for kind, description in sorted(_kinds(tenant).items()):
        tools.append({
            "name": f"{RUN_PREFIX}{kind}",
            "description": (description or f"Run the agent's {kind!r} task.")[:1000],
            "inputSchema": {"type": "object", "additionalProperties": False, "properties": {
                "params": {"type": "object", "description": "The task's parameters (its `ctx.params`)."},
                "wait_s": _WAIT, "idempotency_key": _KEY}},
            # A task may do anything its agent does: not read-only, not known to be idempotent.
            "annotations": {"title": f"Run {kind}", "readOnlyHint": False, "destructiveHint": True,
                            "idempotentHint": False, "openWorldHint": True},
        })
    tools.append({
        "name": "send_message",
        "description": "Send a message to the agent in a thread; the answer is the task that handles it.",
        "inputSchema": {"type": "object", "additionalProperties": False, "required": ["thread", "content"],
                        "properties": {"thread": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,200}$"},
                                       "content": {"type": "string", "minLength": 1},
                                       "wait_s": _WAIT, "idempotency_key": _KEY}},
        "annotations": {"title": "Send a message", "readOnlyHint": False, "destructiveHint": True,
                        "idempotentHint": False, "openWorldHint": True},
    })
    tools.append({
        "name": "get_task",
        "description": "A task's status and, once done, its result.",
        "inputSchema": {"type": "object", "additionalProperties": False, "required": ["task_id"],
                        "properties": {"task_id": {"type": "string"}}},
        "annotations": {"title": "Get a task", "readOnlyHint": True, "openWorldHint": False},
    })
    return tools


def _task_now(tenant: Tenant, task_id: str) -> dict[str, Any] | None:
    """The instance's view of the task (with its ``result``, the last step's output, once done), None while it
    cannot say (down, asleep, not delivered yet)."""
    try:
        answer = task_detail(tenant=tenant, task_id=task_id)
    except (InstanceUnavailable, InstanceProblem, ApplicationError):
        return None
    task = answer.get("task")
    if not isinstance(task, dict):
        return None
    return {**task, "result": answer.get("result")}


def _wait(tenant: Tenant, task_id: str, wait_s: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + min(max(wait_s, 0.0), settings.MCP_ENDPOINT_WAIT_S)
    while True:
        task = _task_now(tenant, task_id)
        if task is not None and task.get("status") in _FINISHED:
            return task
        if time.monotonic() >= deadline:
            return task
        time.sleep(_POLL_S)


def _result(body: dict[str, Any], *, is_error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps(body, default=str)}], "structuredContent": body,
            "isError": is_error}


def _need(scopes: Collection[str], scope: str) -> None:
    if scope not in scopes:
        raise _ToolRefused(f"this token lacks the scope {scope}")


class _ToolRefused(Exception):
    pass


def _args(params: dict[str, Any]) -> dict[str, Any]:
    args = params.get("arguments") or {}
    if not isinstance(args, dict):
        raise RpcError(INVALID_PARAMS, "arguments must be an object")
    return args


def _wait_arg(args: dict[str, Any]) -> float:
    wait = args.get("wait_s", 0)
    if isinstance(wait, bool) or not isinstance(wait, int | float):
        raise _ToolRefused("wait_s must be a number of seconds")
    return float(wait)


def _accepted(tenant: Tenant, item: Any, task_id: str | None, wait_s: float) -> dict[str, Any]:
    if item.status == InboxStatus.REFUSED:
        return _result({"status": "refused", "problem": item.response or {}}, is_error=True)
    body: dict[str, Any] = {"task_id": task_id, "inbox": str(item.id),
                            "status": "queued" if item.status == InboxStatus.PENDING else "accepted"}
    if task_id is not None and wait_s > 0:
        task = _wait(tenant, task_id, wait_s)
        if task is not None:
            body.update(status=task.get("status"), result=task.pop("result", None), task=task)
    return _result(body)


def _call(tenant: Tenant, actor: Actor, scopes: Collection[str], name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name == "get_task":
        _need(scopes, TokenScope.TASKS_READ)
        task_id = args.get("task_id")
        if not isinstance(task_id, str):
            raise _ToolRefused("task_id must be a string")
        task = _task_now(tenant, task_id)
        return _result({"task_id": task_id, "status": "unknown" if task is None else task.get("status"),
                        "result": None if task is None else task.pop("result", None), "task": task})
    if name == "send_message":
        _need(scopes, TokenScope.CONVERSATIONS_WRITE)
        wait_s = _wait_arg(args)
        accepted = message_send(tenant=tenant, thread=args.get("thread"), content=args.get("content"),  # type: ignore[arg-type]
                                idempotency_key=args.get("idempotency_key"), actor=actor)
        answer = accepted.item.response or {}
        task = answer.get("task") if isinstance(answer, dict) else None
        task_id = str(task["id"]) if isinstance(task, dict) and task.get("id") else None
        return _accepted(tenant, accepted.item, task_id, wait_s)
    if name.startswith(RUN_PREFIX) and name[len(RUN_PREFIX):] in _kinds(tenant):
        _need(scopes, TokenScope.TASKS_WRITE)
        params = args.get("params") or {}
        wait_s = _wait_arg(args)
        accepted = task_submit(tenant=tenant, kind=name[len(RUN_PREFIX):], params=params,
                               idempotency_key=args.get("idempotency_key"), actor=actor)
        return _accepted(tenant, accepted.item, str(accepted.item.id), wait_s)
    raise RpcError(INVALID_PARAMS, f"unknown tool: {name[:200]}")


def mcp_answer(message: object, *, tenant: Tenant, actor: Actor, scopes: Collection[str]) -> dict[str, Any] | None:
    """The JSON-RPC response to one message from an MCP client of ``tenant``'s agent (None: nothing to answer)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return _error(None, INVALID_REQUEST, "not a JSON-RPC 2.0 message")
    method = message.get("method")
    if "id" not in message or method is None:
        return None  # a notification (initialized, cancelled) or a client's response: nothing to say
    request_id = message["id"]
    params = message.get("params") or {}
    if not isinstance(method, str) or not isinstance(params, dict):
        return _error(request_id, INVALID_REQUEST, "method must be a string and params an object")
    try:
        return {"jsonrpc": "2.0", "id": request_id, "result": _dispatch(method, params, tenant, actor, scopes)}
    except RpcError as exc:
        return _error(request_id, exc.code, exc.message, exc.data)


def _dispatch(method: str, params: dict[str, Any], tenant: Tenant, actor: Actor,
              scopes: Collection[str]) -> dict[str, Any]:
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1]
        return {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False},
                                                              "resources": {"listChanged": False,
                                                                            "subscribe": False}},
                "serverInfo": SERVER_INFO,
                "instructions": "Tools run this customer's agent: each call is a task or a message. "
                                "Resources read a thread's messages and a task's result."}
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": mcp_tools(tenant)}
    if method == "tools/call":
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "name must be a string")
        try:
            return _call(tenant, actor, scopes, name, _args(params))
        except _ToolRefused as exc:
            return _result({"error": str(exc)}, is_error=True)
        except ApplicationError as exc:  # the inbox refused it (quota, invalid input, idempotency mismatch)
            return _result({"error": str(exc.detail), "status": exc.status_code}, is_error=True)
    if method == "resources/templates/list":
        return {"resourceTemplates": resource_templates()}
    if method == "resources/list":
        return {"resources": resources_list(tenant, scopes)}
    if method == "resources/read":
        return resource_read(tenant, scopes, params.get("uri"))
    raise RpcError(METHOD_NOT_FOUND, f"method not found: {method[:100]}")


def _error(request_id: object, code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}
