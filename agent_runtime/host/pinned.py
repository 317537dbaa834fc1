"""Running one task on an earlier release, in a child process of the host (the version policy's "pinned").

Two releases cannot share one interpreter: both import their own `refund_agent` package, say. So the host starts
``python -m agent_runtime.host.pinned_child TASK`` with the earlier release's install directory in place of its
own (``AGENT_RELEASE_PATH`` and ``PYTHONPATH``) and waits for it, as it would wait for ``run_task``: one task at a
time, in the same sandbox, with the same environment otherwise.

The child writes as the host: its connections carry the host's lease holder in ``application_name``, so the
fence admits its writes while the host holds the lease and refuses them from the moment another host takes it
over (a child outliving a killed host cannot write beside its successor). It also dies with the host
(``PR_SET_PDEATHSIG``). A stop or a cancel reaches it as SIGTERM: it stops at its next step boundary, as the
host's own worker does. Its outcome comes back as its exit code (``OUTCOME_CODES``); any other exit is a crash
of the step, retried with the host's backoff like an effect in doubt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from uuid import UUID

from agent_runtime.host.config import HostConfig, RetainedRelease

__all__ = ["CHILD_MODULE", "HOLDER_VARIABLE", "OUTCOME_CODES", "child_environment", "run_pinned"]

CHILD_MODULE = "agent_runtime.host.pinned_child"
HOLDER_VARIABLE = "AGENT_PINNED_HOLDER"
# run_task's outcomes as exit codes (0 is 'done'); 20 and up are the child's own failures.
OUTCOME_CODES = {"done": 0, "blocked": 10, "stopped": 11, "retry": 12, "failed": 13, "cancelled": 14}
_OUTCOMES = {code: outcome for outcome, code in OUTCOME_CODES.items()}


def child_environment(env: Mapping[str, str], cfg: HostConfig, release: RetainedRelease,
                      holder: str) -> dict[str, str]:
    """The host's environment with ``release`` as the one to load: its directory replaces the host's release
    on ``PYTHONPATH`` (the two releases' modules would shadow each other), and the lease holder to write as."""
    own = str(cfg.release_path) if cfg.release_path is not None else None
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != own]
    # AGENT_KINDS goes too: it names the host's release's kinds, which an earlier release may not provide.
    out = {k: v for k, v in env.items() if k not in ("AGENT_RELEASE_PATH", "AGENT_RELEASE_VERSION",
                                                     "AGENT_RELEASE_DIGEST", "AGENT_RELEASES_RETAINED",
                                                     "AGENT_KINDS")}
    if release.path is not None:  # else the runtime environment's own agents: no release variables at all
        out.update(AGENT_RELEASE_PATH=str(release.path), AGENT_RELEASE_VERSION=release.version,
                   AGENT_RELEASE_DIGEST=release.digest)
        path.append(str(release.path))
    return {**out, "PYTHONPATH": os.pathsep.join(path), HOLDER_VARIABLE: holder}


def run_pinned(cfg: HostConfig, holder: str, task_id: UUID, release: RetainedRelease, *,
               stop: threading.Event, cancelled: set[str]) -> str:
    """Run `task_id` on `release` in a child process; its outcome as ``run_task`` names them.

    ``stop`` (the host stops) and ``cancelled`` (the instance API cancelled the task) send it SIGTERM once: the
    step under way finishes and no further step starts."""
    proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE, str(task_id)],  # noqa: S603 - our own module
                            env=child_environment(os.environ, cfg, release, holder))
    signalled = False
    while True:
        try:
            code = proc.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            if not signalled and (stop.is_set() or str(task_id) in cancelled):
                proc.send_signal(signal.SIGTERM)
                signalled = True
    return _OUTCOMES.get(code, "retry")
