"""The MCP servers an instance may call, from its configuration (no I/O: nothing connects here).

Shape, the same in `AGENT_MCP_SERVERS` (the instance's) and under the reserved key `mcp` of a task's agent
configuration (the customer's; a server of the same name replaces the instance's for that task):

    {"crm": {"url": "https://crm.example/mcp",          # streamable HTTP endpoint
             "credential": "crm-token",                 # optional: a credential NAME, sent as a bearer token
             # or "connection": "acme",                  # a connected account's provider: its access token instead
             "allowed_tools": ["lookup_order"],         # optional: only these tools are listed and callable
             "trust_annotations": true,                 # false: every tool not listed below is an effect
             "timeout_s": 30,
             "tools": {"send_money": "effect",          # per-tool override of the annotations
                       "lookup_order": {"kind": "read_only", "ttl_s": 300}}}}

A credential is a name resolved through the instance's credential source at each call, never a value; a connection
is a provider name whose current access token the instance's connection source hands over at each call.

A stdio server shipped inside the release names a Python module of the release instead of a URL:
`{"tools": {"module": "crm_agent.mcp_server", "args": ["--flag"]}}`, spawned for each session as
`<the host's python> -m <module> <args>` by the host, so inside its sandbox (its identity, its limits), with only
the SDK's default environment (HOME, PATH, ...: no AGENT_* variable, no secret) plus PYTHONPATH. Only the release
(`Agent(mcp_servers=...)`) and the instance (`AGENT_MCP_SERVERS`) may declare one (`stdio=True`); a customer's
configuration may not, and a stdio server takes no credential or connection.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from agent_runtime.errors import ConfigError

__all__ = ["CONFIG_MCP_KEY", "KINDS", "McpServerSpec", "McpSpecInvalid", "ToolOverride", "servers_from_config",
           "servers_from_env", "servers_validate"]

# The reserved top-level key of an agent configuration that names its MCP servers.
CONFIG_MCP_KEY = "mcp"
# Where a call goes: the tool cache, a plain (repeatable) call, or the effect ledger.
KINDS = ("read_only", "idempotent", "effect")
_OPTIONS = ("url", "module", "args", "credential", "connection", "trust_annotations", "timeout_s", "tools",
            "allowed_tools")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_TOOL_OPTIONS = ("kind", "ttl_s")


class McpSpecInvalid(ConfigError):
    """A server spec that cannot be used; `field` is the path of the offending value ("crm.url")."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"mcp server {field}: {message}")
        self.field = field


@dataclass(frozen=True)
class ToolOverride:
    """The operator's word on one tool, over its annotations: its kind, and for a read-only one its cache TTL."""

    kind: str
    ttl_s: float | None = None


@dataclass(frozen=True)
class McpServerSpec:
    name: str
    url: str
    credential: str | None = None
    trust_annotations: bool = True
    timeout_s: float = 30.0
    tools: Mapping[str, ToolOverride] = field(default_factory=dict)
    connection: str | None = None  # a connected account's provider, whose access token is the bearer token
    allowed_tools: frozenset[str] | None = None  # None: every tool the server lists
    module: str | None = None  # a stdio server shipped inside the release (url is then "")
    args: tuple[str, ...] = ()

    @property
    def endpoint(self) -> str:
        """Where the server is: its URL, or `stdio:<module> <args>` (part of a cached read's key)."""
        return self.url if self.module is None else " ".join(("stdio:" + self.module, *self.args))

    def allows(self, tool: str) -> bool:
        return self.allowed_tools is None or tool in self.allowed_tools


def _seconds(field_path: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise McpSpecInvalid(field_path, f"must be a positive number of seconds, not {value!r}")
    return float(value)


def _override(path: str, value: object) -> ToolOverride:
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict):
        raise McpSpecInvalid(path, f"must be one of {list(KINDS)} or an object with a 'kind'")
    unknown = sorted(set(value) - set(_TOOL_OPTIONS))
    if unknown:
        raise McpSpecInvalid(f"{path}.{unknown[0]}", f"is not a tool option (known: {', '.join(_TOOL_OPTIONS)})")
    kind = value.get("kind")
    if kind not in KINDS:
        raise McpSpecInvalid(f"{path}.kind", f"must be one of {list(KINDS)}, not {kind!r}")
    ttl = value.get("ttl_s")
    if ttl is not None and kind != "read_only":
        raise McpSpecInvalid(f"{path}.ttl_s", "only a read_only tool's output is cached")
    return ToolOverride(str(kind), _seconds(f"{path}.ttl_s", ttl) if ttl is not None else None)


def _stdio(name: str, spec: dict[str, Any], stdio: bool) -> tuple[str, tuple[str, ...]]:
    if not stdio:
        raise McpSpecInvalid(f"{name}.module", "a stdio server is shipped inside the release (Agent(mcp_servers=...))"
                                               "; a configuration names servers by url")
    if spec.get("url") is not None:
        raise McpSpecInvalid(f"{name}.url", "a server is reached by url or spawned from a module, not both")
    module = spec["module"]
    if not isinstance(module, str) or not _MODULE_RE.fullmatch(module):
        raise McpSpecInvalid(f"{name}.module", "must be a dotted Python module name (run as python -m <module>)")
    for option in ("credential", "connection"):
        if spec.get(option) is not None:
            raise McpSpecInvalid(f"{name}.{option}", "a stdio server takes no token (it runs inside the sandbox)")
    args = spec.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpSpecInvalid(f"{name}.args", "must be a list of strings")
    return module, tuple(args)


def server_spec(name: str, spec: object, *, stdio: bool = False) -> McpServerSpec:
    """One server's spec, checked: McpSpecInvalid naming the field otherwise. `stdio`: a `module` may be named
    (the release's or the instance's declaration, never a customer's configuration)."""
    if not isinstance(name, str) or not name or "/" in name:
        raise McpSpecInvalid(str(name), "a server name is a non-empty string without '/'")
    if not isinstance(spec, dict):
        raise McpSpecInvalid(name, "must be an object with a 'url'")
    unknown = sorted(set(spec) - set(_OPTIONS))
    if unknown:
        raise McpSpecInvalid(f"{name}.{unknown[0]}", f"is not an option (known: {', '.join(_OPTIONS)})")
    module: str | None = None
    args: tuple[str, ...] = ()
    if spec.get("module") is not None:
        module, args = _stdio(name, spec, stdio)
    elif spec.get("args") is not None:
        raise McpSpecInvalid(f"{name}.args", "only a stdio server (module) takes args")
    url: object = spec.get("url") if module is None else ""
    if module is None and (not isinstance(url, str) or urlparse(url).scheme not in ("http", "https")
                           or not urlparse(url).netloc):
        raise McpSpecInvalid(f"{name}.url", "must be an http:// or https:// URL (a streamable HTTP endpoint)")
    credential = spec.get("credential")
    if credential is not None and (not isinstance(credential, str) or not credential):
        raise McpSpecInvalid(f"{name}.credential", "must be the NAME of a credential (a non-empty string)")
    connection = spec.get("connection")
    if connection is not None and (not isinstance(connection, str) or not connection):
        raise McpSpecInvalid(f"{name}.connection", "must be a connected account's provider (a non-empty string)")
    if connection is not None and credential is not None:
        raise McpSpecInvalid(f"{name}.connection", "a server takes its token from a credential or a connection, "
                                                   "not both")
    allowed = spec.get("allowed_tools")
    if allowed is not None and (not isinstance(allowed, list)
                                or not all(isinstance(t, str) and t for t in allowed)):
        raise McpSpecInvalid(f"{name}.allowed_tools", "must be a list of tool names")
    trust = spec.get("trust_annotations", True)
    if not isinstance(trust, bool):
        raise McpSpecInvalid(f"{name}.trust_annotations", "must be true or false")
    tools = spec.get("tools", {})
    if not isinstance(tools, dict):
        raise McpSpecInvalid(f"{name}.tools", "must be an object of tool name -> kind")
    return McpServerSpec(name, str(url), credential, trust, _seconds(f"{name}.timeout_s", spec.get("timeout_s", 30.0)),
                         {str(t): _override(f"{name}.tools.{t}", v) for t, v in tools.items()}, connection,
                         frozenset(allowed) if allowed is not None else None, module, args)


def servers_validate(servers: object, *, stdio: bool = False) -> dict[str, McpServerSpec]:
    """The specs of a `{name: spec}` object; McpSpecInvalid naming the field when one is not usable."""
    if not isinstance(servers, dict):
        raise McpSpecInvalid("", "the MCP servers must be an object of server name -> {\"url\": ...}")
    return {name: server_spec(name, spec, stdio=stdio) for name, spec in servers.items()}


def servers_from_env(raw: str) -> dict[str, McpServerSpec]:
    """`AGENT_MCP_SERVERS` (JSON) as specs; {} when unset."""
    if not raw:
        return {}
    try:
        servers = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"AGENT_MCP_SERVERS is not valid JSON: {exc}") from exc
    return servers_validate(servers, stdio=True)


def servers_from_config(config: Mapping[str, Any]) -> dict[str, McpServerSpec]:
    """The servers a task's agent configuration names under `mcp` ({} without the key)."""
    configured = config.get(CONFIG_MCP_KEY)
    return {} if configured is None else servers_validate(configured)
