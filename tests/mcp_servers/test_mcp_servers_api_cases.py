"""``/api/v1/mcp-servers`` (the operator's servers, for all its customers) held to the shared API test base."""

from __future__ import annotations

from typing import Any

from mcp_servers.models import McpServer
from mcp_servers.services import mcp_server_create
from tenants.actors import SYSTEM
from tenants.audit import AuditAction
from tenants.choices import TokenScope
from tenants.models import Operator
from tests.api_cases import OperatorCollectionCases


class TestOperatorMcpServers(OperatorCollectionCases):
    url = "/api/v1/mcp-servers"
    read_scope = TokenScope.TENANTS_READ
    write_scope = TokenScope.TENANTS_WRITE
    audit_create = AuditAction.MCP_SERVER_CREATE
    audit_delete = AuditAction.MCP_SERVER_DELETE
    invalid_field = "url"

    def create_data(self, operator: Operator) -> dict[str, Any]:
        return {"name": "docs", "url": "https://docs.example/mcp", "tools": {"search": {"kind": "read_only"}}}

    def invalid_data(self, operator: Operator) -> dict[str, Any]:
        return {"name": "docs", "url": "ftp://docs.example/mcp"}

    def make(self, operator: Operator) -> str:
        return str(mcp_server_create(operator=operator, tenant=None, actor=SYSTEM, name="crm",
                                     url="https://crm.example/mcp").pk)

    def count(self, operator: Operator) -> int:
        return McpServer.objects.filter(operator=operator).count()
