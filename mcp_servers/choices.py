"""Kinds of MCP tool calls and the names the registry holds. No I/O here."""

from __future__ import annotations

import re

from django.db import models

__all__ = ["NAME_RE", "ServerScope", "ToolKind"]

# A server's name: what `ctx.mcp(name)` says and what the effect ledger's `mcp:<server>/<tool>` carries.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,59}$")


class ToolKind(models.TextChoices):
    """Where the runtime sends a call of the tool (agent_runtime.mcp.config.KINDS), over its annotations."""

    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    EFFECT = "effect"


class ServerScope(models.TextChoices):
    """Who a registry entry is for: every customer of the operator, or one customer."""

    OPERATOR = "operator"
    TENANT = "tenant"
