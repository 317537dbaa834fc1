"""Install a release's wheel into a directory of its own and ask the runtime which kinds it provides.

Both run as separate processes with timeouts: ``pip install --no-deps --no-index --target`` (nothing is
fetched: the release runs on the runtime's installed dependencies, checked beforehand by
``releases.wheels.missing_dependencies``), then ``python -m agent_runtime.host.probe`` in the instances'
sandbox as ``nobody`` (the operator's code is untrusted; it never runs inside the control plane).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from controlplane.errors import ValidationFailed
from provisioning.drivers.local_sandbox import untrusted_argv

__all__ = ["Probed", "release_install", "release_install_and_probe"]


@dataclass(frozen=True)
class Probed:
    distribution: str
    version: str
    kinds: dict[str, str]
    isolation: str
    # Each kind's declared configuration schema (Agent(config_schema=...)); merged by releases.config_schema.
    config_schemas: dict[str, Any] = field(default_factory=dict)
    # Each kind's declared connections (Agent(connections=[...])): the providers its steps may ask tokens of.
    connections: dict[str, list[str]] = field(default_factory=dict)
    # Each kind's declared internet hosts (Agent(egress=[...])), as the probe printed them: checked by the caller.
    egress: dict[str, list[object]] = field(default_factory=dict)


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def release_install(wheel: Path, site: Path) -> None:
    """``wheel`` installed into ``site`` (created), readable by every uid (instances run as their own);
    ValidationFailed names the cause."""
    timeout = settings.RELEASE_VALIDATION_TIMEOUT_S
    try:
        installed = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile",
             "--disable-pip-version-check", "--target", str(site), str(wheel)],
            capture_output=True, text=True, timeout=timeout, check=False, cwd=wheel.parent,
        )
    except subprocess.TimeoutExpired:
        raise ValidationFailed(f"the wheel did not install within {timeout:g} s") from None
    if installed.returncode != 0:
        raise ValidationFailed(f"the wheel does not install: {_tail(installed.stderr or installed.stdout)}")
    # The scratch directory is the probe's only writable path; nobody must be able to read the install.
    for path in (site.parent, *site.rglob("*"), site):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def release_install_and_probe(wheel: Path, site: Path) -> Probed:
    """``wheel`` installed into ``site`` (created), then probed; ValidationFailed names the cause."""
    timeout = settings.RELEASE_VALIDATION_TIMEOUT_S
    release_install(wheel, site)
    argv, isolation = untrusted_argv([sys.executable, "-m", "agent_runtime.host.probe", "--path", str(site)],
                                     writable=[site.parent])
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(settings.BASE_DIR), "HOME": str(site.parent)}
    try:
        probed = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env,
                                cwd=site.parent)
    except subprocess.TimeoutExpired:
        raise ValidationFailed(f"importing the release took longer than {timeout:g} s") from None
    try:
        answer = json.loads(probed.stdout.strip().splitlines()[-1]) if probed.stdout.strip() else {}
    except ValueError:
        answer = {}
    if probed.returncode == 2 and answer.get("error"):
        raise ValidationFailed(f"the release does not load: {answer['error']}")
    if probed.returncode != 0 or not isinstance(answer.get("kinds"), dict):
        raise ValidationFailed(f"the release does not load: {_tail(probed.stderr or probed.stdout)}")
    return Probed(distribution=str(answer["distribution"]), version=str(answer["version"]),
                  kinds={str(k): str(v) for k, v in answer["kinds"].items()}, isolation=isolation.mode,
                  config_schemas=dict(answer.get("config_schemas") or {}),
                  connections={str(k): [str(p) for p in v] for k, v in (answer.get("connections") or {}).items()
                               if isinstance(v, list)},
                  egress={str(k): list(v) for k, v in (answer.get("egress") or {}).items() if isinstance(v, list)})
