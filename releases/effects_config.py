"""The reserved ``effects`` and ``mcp`` keys of an agent configuration: the customer's own effect providers (issue
32) and MCP servers (issue 34).

``effects`` has the shape of an instance's ``AGENT_EFFECTS`` (effect name -> {"type": "http" | "smtp" | "webhook",
...}); ``mcp`` that of ``AGENT_MCP_SERVERS`` (server name -> {"url", "credential", "trust_annotations", "timeout_s",
"tools"}). Their credentials are names (``bearer_credential``, ``secret_credential``, ``user:credential-name@`` in
smtp URLs, an MCP server's ``credential``), never values. Both are checked with the runtime's own rules: the control
plane never imports agent code, so it runs ``python -m agent_runtime.effects.check`` and ``python -m
agent_runtime.mcp.check`` (no I/O beyond stdin/stdout, milliseconds), as it runs the release probe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from controlplane.errors import ValidationFailed

from .config_schema import CONFIG_EFFECTS_KEY, CONFIG_MCP_KEY

__all__ = ["effects_config_check"]

# Reserved key -> the runtime module that checks it.
_CHECKS = {CONFIG_EFFECTS_KEY: "agent_runtime.effects.check", CONFIG_MCP_KEY: "agent_runtime.mcp.check"}


def effects_config_check(config: Mapping[str, Any], *, root: str) -> dict[str, str]:
    """400 naming the field (``overrides.effects.payment.url``, ``overrides.mcp.crm.url``) unless the
    configuration's ``effects`` and ``mcp``, if any, are what the runtime builds providers and MCP servers from;
    else the vault credentials they name, by field (``overrides.effects.payment.bearer_credential`` -> ``stripe``,
    ``overrides.mcp.crm.credential`` -> ``crm-token``), for the caller to check the tenant's vault.
    RuntimeError when a check itself could not run (never accepted unchecked)."""
    named: dict[str, str] = {}
    for key, module in _CHECKS.items():
        if key in config:
            named.update(_runtime_check(key, module, config[key], root=root))
    return named


def _runtime_check(key: str, module: str, value: Any, *, root: str) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(settings.BASE_DIR)}
    done = subprocess.run([sys.executable, "-m", module], input=json.dumps(value), capture_output=True, text=True,
                          timeout=settings.RELEASE_VALIDATION_TIMEOUT_S, check=False, env=env)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        raise RuntimeError(f"the {key} check did not run (exit {done.returncode}): {done.stderr[-300:]}")
    if "field" in answer:
        field = ".".join(part for part in (root, key, str(answer["field"])) if part)
        raise ValidationFailed(f"{field}: {answer.get('message', 'invalid')}"[:500], extra={"field": field})
    return {".".join(part for part in (root, key, str(field)) if part): str(name)
            for field, name in dict(answer.get("credentials") or {}).items()}
