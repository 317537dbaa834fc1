"""``manage.py watch_instances``: the process that notices a dead instance in about a second, on either profile.

- local profile: every local agent-host, whoever started it (``provisioning.recovery.local_exit_watch``: a pidfd per
  process, the set of instances meant to run re-read from PostgreSQL every ``--refresh-s``). One watcher works
  for the fleet: it holds the leader lease ``local-exit-watch``. ``scripts/services.py`` runs it next to web,
  worker and beat.
- kubernetes profile: the agent pods' events (``provisioning.recovery.pod_watch``), watched while holding the leader
  lease ``pod-watch``; deploy/kubernetes/70-instance-watcher.yaml runs two replicas, one watching, one standing by
  (two watching at once would be harmless too: ``recovery_start`` refuses a second active recovery).

Either way a standby takes over within ``LEADER_LEASE_S`` when the watching one dies, at once when it stops
cleanly, and a watcher whose lease was taken (it was frozen or cut off) stops watching (``controlplane.leases``).

It runs until SIGTERM or SIGINT (a supervisor's stop, a Deployment's, Ctrl-C), printing what it does: on the
local profile each process it starts watching and each exit with what was done about it; on Kubernetes each
list and watch, each interruption and resume, and each pod event that meant something.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.leases.lease import LeaderLease
from controlplane.leases.loop import leader_loop
from provisioning.choices import ResourceKind
from provisioning.drivers.local_process import LocalProcessDriver
from provisioning.drivers.registry import driver_for
from provisioning.recovery.local_exit_watch import LocalExitWatcher
from provisioning.recovery.pod_watch import AGENT_POD_SELECTOR, PodWatcher

POD_WATCH_LEASE = "pod-watch"


class Command(BaseCommand):
    help = ("Start the recovery of an agent instance that died, in about a second, with no heartbeat sweep. "
            "Local profile: watches every local agent-host process (a pidfd each, whoever started it; the "
            "instances meant to run are re-read from PostgreSQL every --refresh-s), one watcher fleet-wide "
            "(a leader lease in PostgreSQL; others stand by). Kubernetes profile: watches the agent pods' "
            "events, one watcher at a time (a leader lease too). Planned stops, restarts, sleeps and release "
            "switches are left alone. Runs until SIGTERM/SIGINT.")

    def add_arguments(self, parser: CommandParser) -> None:
        local = parser.add_argument_group("local profile")
        local.add_argument("--refresh-s", type=float, default=1.0,
                           help="how often the set of local instances meant to run is re-read (an instance "
                                "started by anyone is watched within this)")
        k8s = parser.add_argument_group("kubernetes profile")
        k8s.add_argument("--timeout-s", type=int, default=300,
                         help="server-side timeout of each watch request; it then resumes from where it was")
        k8s.add_argument("--restart-grace-s", type=float, default=None,
                         help="how long the kubelet has to restart a terminated agent container in place "
                              "before a recovery starts (default: HEARTBEAT_TIMEOUT_S)")
        k8s.add_argument("--backoff-max-s", type=float, default=30.0,
                         help="longest wait between attempts while the API cannot be reached")
        k8s.add_argument("--label-selector", default=AGENT_POD_SELECTOR, help="which pods are agent pods")

    def handle(self, *args: Any, refresh_s: float, timeout_s: int,
               restart_grace_s: float | None, backoff_max_s: float, label_selector: str, **options: Any) -> None:
        def say(message: str) -> None:
            self.stdout.write(message)
            self.stdout.flush()

        if settings.PROVISIONING_PROFILE == "kubernetes":
            grace_s = settings.HEARTBEAT_TIMEOUT_S if restart_grace_s is None else restart_grace_s
            watchers: list[PodWatcher] = []
            lease = LeaderLease(POD_WATCH_LEASE)

            def watcher() -> PodWatcher:  # a fresh one per term: it lists, then watches
                watchers.append(PodWatcher(timeout_s=timeout_s, backoff_max_s=backoff_max_s, progress=say,
                                           label_selector=label_selector, restart_grace_s=grace_s,
                                           leading=lease.held))
                return watchers[-1]

            say(f"watching agent pods ({label_selector}) while holding the lease {POD_WATCH_LEASE!r}; "
                f"restart grace {grace_s:g} s")
            stopping = threading.Event()
            self._run(lambda: leader_loop(lease, watcher, stopping=stopping, role="pod watcher",
                                          progress=say), stopping.set, say)
            say(f"stopped at resourceVersion {watchers[-1].resource_version if watchers else None}")
        else:
            runtime = driver_for(ResourceKind.RUNTIME)
            if runtime.name != LocalProcessDriver.name:
                raise CommandError(f"the runtime driver {runtime.name!r} starts no process to watch "
                                   "(PROVISIONING_RUNTIME_DRIVER); watch_instances watches local agent-hosts "
                                   "or, with PROVISIONING_PROFILE=kubernetes, agent pods")
            local = LocalExitWatcher(refresh_s=refresh_s, progress=say)
            self._run(local.run, local.stop, say)
            say("stopped")
        sys.stdout.flush()

    @staticmethod
    def _run(run: Callable[[], None], stop: Callable[[], None], say: Callable[[str], None]) -> None:
        def on_signal(signum: int, _frame: object) -> None:
            say(f"{signal.Signals(signum).name}: stopping")
            stop()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        run()
