"""What this machine can give a local instance: a sandbox, and a network namespace of its own (issue 38).

One rule, read by three readers that must agree: the driver (``local_sandbox.sandbox_support``,
``local_network.network_isolated``), the posture's ``network`` line, and ``scripts/services.py``, which decides
before any Django is configured whether ``make run``/``make demo`` supervise the egress proxy and grant the demo's
peers. So this module takes the settings as plain strings and imports nothing of Django: no I/O beyond
``os.geteuid`` and looking tools up on ``PATH``.

``LOCAL_INSTANCE_NETWORK``:

- ``auto`` (the default): isolated wherever the instance is sandboxed (root, ``bwrap``/``setpriv``/``prlimit``,
  ``LOCAL_INSTANCE_ISOLATION`` not ``off``) and ``socat`` is there for the relays; shared elsewhere, with the
  reason (the posture's ``network`` line prints it as a warning);
- ``isolated``: always asked for (a sandboxed instance without ``socat`` is refused at its start, not degraded);
- ``shared``: the machine's network namespace, on purpose.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["NETWORK_MODES", "SANDBOX_TOOLS", "network_choice", "sandbox_missing"]

NETWORK_MODES = ("auto", "isolated", "shared")
SANDBOX_TOOLS = ("bwrap", "setpriv", "prlimit")


def sandbox_missing(isolation: str, *, path: str | None = None, euid: int | None = None) -> str:
    """Why this process cannot sandbox instances, in one sentence; empty when it can. ``path`` is the ``PATH`` to
    look tools up on (default: this process's)."""
    if isolation == "off":
        return "LOCAL_INSTANCE_ISOLATION=off"
    if (os.geteuid() if euid is None else euid) != 0:
        return "the control plane does not run as root, so it cannot give each instance its own OS user"
    missing = [tool for tool in SANDBOX_TOOLS if not shutil.which(tool, path=path)]
    if missing:
        return f"missing {', '.join(missing)} (Debian: apt-get install bubblewrap util-linux)"
    return ""


def network_choice(network: str, isolation: str, *, path: str | None = None,
                   euid: int | None = None) -> tuple[bool, str]:
    """Whether sandboxed instances get a network namespace of their own, and, when not, why (for ``auto``: what
    this machine lacks; for ``shared``: that it was chosen)."""
    if network == "isolated":
        return True, ""
    if network == "shared":
        return False, "LOCAL_INSTANCE_NETWORK=shared"
    missing = sandbox_missing(isolation, path=path, euid=euid)
    if missing:
        return False, f"LOCAL_INSTANCE_NETWORK=auto and no sandbox: {missing}"
    if not shutil.which("socat", path=path):
        return False, "LOCAL_INSTANCE_NETWORK=auto and socat is missing (Debian: apt-get install socat)"
    return True, ""
