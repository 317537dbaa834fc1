"""``POST /api/v1/tenants/{id}/mcp``: the customer's agent as an MCP server (streamable HTTP, stateless).

The view authenticates like the rest of the tenant API (a customer token of this tenant, or the operator's token
with the scope), parses one JSON-RPC message and hands it to ``mcp_servers.agent_endpoint``. A request is answered
with one ``application/json`` body; a notification or a client's response with 202 and no body. No session is
opened (no ``Mcp-Session-Id``), so there is no GET stream and nothing to DELETE: both are 405.
"""

from __future__ import annotations

import json

from django.http import HttpResponse, JsonResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request

from controlplane.openapi import BODY_REQUIRED
from conversations.api.permissions import principal_scopes
from conversations.api.views import TenantAPIView
from tenants.choices import TokenScope

from ..agent_endpoint import PROTOCOL_VERSIONS, mcp_answer
from ..jsonrpc import INVALID_REQUEST, PARSE_ERROR

PROTOCOL_HEADER = "MCP-Protocol-Version"
# One JSON-RPC 2.0 message (``mcp_answer``): what is not one is answered 400 with a JSON-RPC error (not a problem:
# MCP clients read JSON-RPC), as is a batch; an error about a request with an id is a 200 carrying the error.
JSONRPC_MESSAGE = {"type": "object", "required": ["jsonrpc"],
                   "properties": {"jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer", "null"]},
                                  "method": {"type": "string"}, "params": {"type": "object"}}}
JSONRPC_ERROR = {"type": "object", "required": ["jsonrpc", "id", "error"],
                 "properties": {"jsonrpc": {"const": "2.0"}, "id": {"type": "null"},
                                "error": {"type": "object", "required": ["code", "message"],
                                          "properties": {"code": {"type": "integer"},
                                                         "message": {"type": "string"}}}}}


def _rpc_error(code: int, message: str) -> JsonResponse:
    return JsonResponse({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}, status=400)


class AgentMcpEndpointView(TenantAPIView):
    # Listing the tools needs tasks:read; each tool checks the scope its call needs (tasks:write to run a task,
    # conversations:write to send a message), each resource read the scope of its REST twin (conversations:read
    # for a thread's messages).
    scopes = {"POST": TokenScope.TASKS_READ}

    @extend_schema(operation_id="tenant_mcp_endpoint", tags=["mcp"], request={"application/json": JSONRPC_MESSAGE},
                   extensions={BODY_REQUIRED: True},
                   responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description="The JSON-RPC response."),
                              202: OpenApiResponse(description="A notification or response: accepted, no body."),
                              400: OpenApiResponse(JSONRPC_ERROR, description="Not one JSON-RPC 2.0 message: a "
                                                   "JSON-RPC error (`application/json`); a request refused before "
                                                   "it is read (a NUL in the path) is a problem.")},
                   description="The customer's agent as an MCP server (Model Context Protocol, streamable HTTP "
                               "transport, stateless, JSON responses): one JSON-RPC message per POST. Tools: "
                               "`run_<kind>` per agent kind of the customer's release, `send_message` and "
                               "`get_task`; resources `thread://{thread}/messages` and `task://{task_id}`. Writes go "
                               "through the durable inbox. A customer token works here "
                               "(its tenant only). See docs/mcp.md.")
    def post(self, request: Request, tenant_id: str) -> HttpResponse:
        tenant = self.tenant(request, tenant_id)
        asked = request.headers.get(PROTOCOL_HEADER)
        if asked is not None and asked not in PROTOCOL_VERSIONS:
            return _rpc_error(INVALID_REQUEST, f"unsupported {PROTOCOL_HEADER}: {asked[:40]}")
        try:
            message = json.loads(request.body)
        except ValueError:
            return _rpc_error(PARSE_ERROR, "the body is not JSON")
        if isinstance(message, list):
            return _rpc_error(INVALID_REQUEST, "JSON-RPC batches are not accepted (one message per request)")
        answer = mcp_answer(message, tenant=tenant, actor=self.actor(request), scopes=principal_scopes(request.user))
        if answer is None:
            return HttpResponse(status=202)
        return JsonResponse(answer, status=400 if "error" in answer and answer.get("id") is None else 200)
