"""The MCP servers an operator registers, for all its customers or for one (issue 34).

No token is stored here: a server names where its bearer token comes from at call time, a credential of the
customer's vault (``credential``, a name) or a connected account (``connection``, a provider), and the instance
asks the control plane for the value at each call.
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models

from tenants.models import Operator, Tenant

__all__ = ["McpServer"]


class McpServer(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="mcp_servers")
    # None: every customer of the operator has it; a customer's own entry of the same name replaces it.
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="mcp_servers")
    name = models.SlugField(max_length=60)
    url = models.URLField(max_length=2000, help_text="the server's streamable HTTP endpoint")
    credential = models.CharField(max_length=200, blank=True, help_text="a credential NAME of the customer's vault")
    connection = models.SlugField(max_length=60, blank=True, help_text="a connected account's provider")
    trust_annotations = models.BooleanField(default=True, help_text="false: a tool without an override is an effect")
    timeout_s = models.FloatField(default=30.0)
    tools = models.JSONField(default=dict, blank=True, help_text="tool -> kind (or {kind, ttl_s}): the override")
    # None: every tool the server lists; a list: only those are listed to the agent and callable.
    allowed_tools = ArrayField(models.CharField(max_length=200), null=True, blank=True)
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operator", "name"], condition=models.Q(tenant__isnull=True),
                                    name="mcp_server_operator_name_unique"),
            models.UniqueConstraint(fields=["tenant", "name"], condition=models.Q(tenant__isnull=False),
                                    name="mcp_server_tenant_name_unique"),
            models.CheckConstraint(condition=models.Q(credential="") | models.Q(connection=""),
                                   name="mcp_server_one_token_source"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id or self.operator_id}: {self.name}"

    def spec(self) -> dict[str, object]:
        """The runtime's spec of this server (agent_runtime.mcp.config): names only, never a value."""
        spec: dict[str, object] = {"url": self.url, "trust_annotations": self.trust_annotations,
                                   "timeout_s": self.timeout_s, "tools": dict(self.tools)}
        if self.credential:
            spec["credential"] = self.credential
        if self.connection:
            spec["connection"] = self.connection
        if self.allowed_tools is not None:
            spec["allowed_tools"] = list(self.allowed_tools)
        return spec
