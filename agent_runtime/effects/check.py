"""`python -m agent_runtime.effects.check`: validate an `effects` configuration read as JSON on stdin.

The control plane never imports agent code (it runs it as a separate process, as it probes a release), yet a
customer's `effects` must be refused on write with the runtime's own rules (``effects_validate``, no I/O). Prints
one JSON line: {"credentials": {field: name}} when valid (the vault credentials it names, which the control plane
checks its tenant's vault holds), {"field": "payment.url", "message": "..."} when not; exit 0 either way, 2 when
stdin is not JSON.
"""

from __future__ import annotations

import json
import sys

from agent_runtime.effects.config import EffectsSpecInvalid, effects_credentials, effects_validate

__all__ = ["main"]


def main() -> int:
    try:
        effects = json.loads(sys.stdin.read())
    except ValueError as exc:
        print(json.dumps({"error": f"stdin is not JSON: {exc}"}))
        return 2
    try:
        effects_validate(effects)
    except EffectsSpecInvalid as exc:
        print(json.dumps({"field": exc.field, "message": str(exc)[:400]}))
        return 0
    print(json.dumps({"credentials": effects_credentials(effects)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
