"""`python -m agent_runtime.mcp.check`: validate an `mcp` configuration (server name -> spec) read as JSON on stdin.

The control plane never imports agent code, yet a customer's `mcp` key must be refused on write with the runtime's
own rules (``servers_validate``, no I/O), as `agent_runtime.effects.check` does for `effects`. Prints one JSON line:
{"credentials": {field: name}} when valid (the vault credentials it names, e.g. {"crm.credential": "crm-token"},
which the control plane checks its tenant's vault holds), {"field": "crm.url", "message": "..."} when not; exit 0
either way, 2 when stdin is not JSON.
"""

from __future__ import annotations

import json
import sys

from agent_runtime.mcp.config import McpSpecInvalid, servers_validate

__all__ = ["main"]


def main() -> int:
    try:
        servers = json.loads(sys.stdin.read())
    except ValueError as exc:
        print(json.dumps({"error": f"stdin is not JSON: {exc}"}))
        return 2
    try:
        specs = servers_validate(servers)
    except McpSpecInvalid as exc:
        print(json.dumps({"field": exc.field, "message": str(exc)[:400]}))
        return 0
    print(json.dumps({"credentials": {f"{name}.credential": spec.credential for name, spec in specs.items()
                                      if spec.credential is not None}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
