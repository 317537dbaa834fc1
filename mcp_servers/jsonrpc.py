"""JSON-RPC 2.0 pieces the customer's MCP endpoint shares (``agent_endpoint`` for tools, ``agent_resources`` for
resources): the error codes and the exception that becomes a JSON-RPC error answer. No I/O here."""

from __future__ import annotations

from typing import Any

__all__ = ["FORBIDDEN", "INTERNAL_ERROR", "INVALID_PARAMS", "INVALID_REQUEST", "METHOD_NOT_FOUND", "PARSE_ERROR",
           "RpcError"]

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
# Implementation-defined (-32000..-32019): the token lacks the scope a read needs. -32000 and -32001 are the SDK's
# own (connection closed, timeout) and -32002 is retired ("resource not found" of older revisions, now -32602).
FORBIDDEN = -32003


class RpcError(Exception):
    """Answered as a JSON-RPC error (``data`` goes along: what a client needs to tell a retry from a refusal)."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
