"""The reserved ``effects`` key of an agent configuration: the customer's own effect providers (issue 32).

Same shape as an instance's ``AGENT_EFFECTS`` (effect name -> {"type": "http" | "smtp" | "webhook", ...}); its
credentials are names (``bearer_credential``, ``secret_credential``, ``user:credential-name@`` in smtp URLs), never
values. It is checked with the runtime's own rules: the control plane never imports agent code, so it runs
``python -m agent_runtime.effects.check`` (no I/O beyond stdin/stdout, milliseconds), as it runs the release probe.
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

from .config_schema import CONFIG_EFFECTS_KEY

__all__ = ["effects_config_check"]


def effects_config_check(config: Mapping[str, Any], *, root: str) -> dict[str, str]:
    """400 naming the field (``overrides.effects.payment.url``) unless the configuration's ``effects``, if any, is
    what the runtime builds providers from; else the vault credentials it names, by field
    (``overrides.effects.payment.bearer_credential`` -> ``stripe``), for the caller to check the tenant's vault.
    RuntimeError when the check itself could not run (never accepted unchecked)."""
    if CONFIG_EFFECTS_KEY not in config:
        return {}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(settings.BASE_DIR)}
    done = subprocess.run([sys.executable, "-m", "agent_runtime.effects.check"],
                          input=json.dumps(config[CONFIG_EFFECTS_KEY]), capture_output=True, text=True,
                          timeout=settings.RELEASE_VALIDATION_TIMEOUT_S, check=False, env=env)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        raise RuntimeError(f"the effects check did not run (exit {done.returncode}): {done.stderr[-300:]}")
    if "field" in answer:
        field = ".".join(part for part in (root, CONFIG_EFFECTS_KEY, str(answer["field"])) if part)
        raise ValidationFailed(f"{field}: {answer.get('message', 'invalid')}"[:500], extra={"field": field})
    return {".".join(part for part in (root, CONFIG_EFFECTS_KEY, str(field)) if part): str(name)
            for field, name in dict(answer.get("credentials") or {}).items()}
