"""The MCP server registry: an operator's servers for every customer, and one customer's own. Thin views over
``mcp_servers.services`` and ``mcp_servers.selectors``; reads need ``tenants:read``, writes ``tenants:write``.
Lookups go through the caller's operator: another's servers and customers are a 404."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from tenants.api.views import ScopedView
from tenants.choices import TokenScope
from tenants.selectors import tenant_get

from ..selectors import mcp_server_get, mcp_server_list, tenant_mcp_server_list
from ..services import mcp_server_create, mcp_server_delete
from .serializers import McpServerCreateInput, McpServerOutput

S = TokenScope
TAGS = ["mcp"]


class McpServersView(ScopedView):
    scopes = {"GET": S.TENANTS_READ, "POST": S.TENANTS_WRITE, "DELETE": S.TENANTS_WRITE}


class OperatorMcpServerListView(McpServersView):
    @extend_schema(operation_id="mcp_servers_list", tags=TAGS, responses=McpServerOutput(many=True),
                   description="Your MCP servers for every customer: name, URL, where the token comes from (a "
                               "credential name or a connected account's provider), tool overrides and allowed "
                               "tools. Never a token.")
    def get(self, request: Request) -> Response:
        return Response(McpServerOutput(mcp_server_list(operator=self.operator(request)), many=True).data)

    @extend_schema(operation_id="mcp_servers_create", tags=TAGS, request=McpServerCreateInput,
                   responses={201: McpServerOutput},
                   description="Register an MCP server (streamable HTTP, https) for every customer of yours. Each "
                               "customer's instance gets it with its next task; a customer's own server of the "
                               "same name replaces it for that customer.")
    def post(self, request: Request) -> Response:
        body = self.body(request, McpServerCreateInput)
        row = mcp_server_create(operator=self.operator(request), tenant=None, actor=self.actor(request), **body)
        return Response(McpServerOutput(row).data, status=status.HTTP_201_CREATED)


class OperatorMcpServerDetailView(McpServersView):
    @extend_schema(operation_id="mcp_servers_retrieve", tags=TAGS, responses=McpServerOutput,
                   description="One of your MCP servers for every customer.")
    def get(self, request: Request, server_id: str) -> Response:
        row = mcp_server_get(operator=self.operator(request), server_id=server_id)
        return Response(McpServerOutput(row).data)

    @extend_schema(operation_id="mcp_servers_delete", tags=TAGS, responses={204: None},
                   description="Remove an MCP server for every customer: the next task of each instance no longer "
                               "has it.")
    def delete(self, request: Request, server_id: str) -> Response:
        mcp_server_delete(operator=self.operator(request), tenant=None, server_id=server_id, actor=self.actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TenantMcpServerListView(McpServersView):
    @extend_schema(operation_id="tenant_mcp_servers_list", tags=TAGS, responses=McpServerOutput(many=True),
                   description="The MCP servers the customer's instance gets: yours for every customer (`scope` "
                               "`operator`) and the customer's own (`tenant`), one per name (its own wins).")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        return Response(McpServerOutput(tenant_mcp_server_list(tenant=tenant), many=True).data)

    @extend_schema(operation_id="tenant_mcp_servers_create", tags=TAGS, request=McpServerCreateInput,
                   responses={201: McpServerOutput},
                   description="Register an MCP server for this customer only. A `credential` must be one the "
                               "customer's vault holds.")
    def post(self, request: Request, tenant_id: str) -> Response:
        operator = self.operator(request)
        tenant = tenant_get(operator=operator, tenant_id=tenant_id, live=True)
        body = self.body(request, McpServerCreateInput)
        row = mcp_server_create(operator=operator, tenant=tenant, actor=self.actor(request), **body)
        return Response(McpServerOutput(row).data, status=status.HTTP_201_CREATED)


class TenantMcpServerDetailView(McpServersView):
    @extend_schema(operation_id="tenant_mcp_servers_retrieve", tags=TAGS, responses=McpServerOutput,
                   description="One of the customer's own MCP servers.")
    def get(self, request: Request, tenant_id: str, server_id: str) -> Response:
        operator = self.operator(request)
        tenant = tenant_get(operator=operator, tenant_id=tenant_id)
        return Response(McpServerOutput(mcp_server_get(operator=operator, server_id=server_id, tenant=tenant)).data)

    @extend_schema(operation_id="tenant_mcp_servers_delete", tags=TAGS, responses={204: None},
                   description="Remove one of the customer's own MCP servers (a server of yours of the same name, "
                               "if any, applies again).")
    def delete(self, request: Request, tenant_id: str, server_id: str) -> Response:
        operator = self.operator(request)
        tenant = tenant_get(operator=operator, tenant_id=tenant_id)
        mcp_server_delete(operator=operator, tenant=tenant, server_id=server_id, actor=self.actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
