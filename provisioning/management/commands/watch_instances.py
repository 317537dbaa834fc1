"""``manage.py watch_instances``: the Kubernetes profile's pod watcher (``provisioning.pod_watch``) as a process.

It runs until SIGTERM or SIGINT (a Deployment's stop, Ctrl-C), printing what it does: each list and watch,
each interruption and resume, and each pod event that meant something with what was done about it. One
replica is enough (deploy/kubernetes/70-instance-watcher.yaml); two at once are harmless, since
``recovery_start`` refuses a second active recovery of one instance.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from provisioning.pod_watch import AGENT_POD_SELECTOR, PodWatcher


class Command(BaseCommand):
    help = "Watch the agent pods (Kubernetes profile) and start the recovery of an instance whose pod died."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--timeout-s", type=int, default=300,
                            help="server-side timeout of each watch request; it then resumes from where it was")
        parser.add_argument("--restart-grace-s", type=float, default=None,
                            help="how long the kubelet has to restart a terminated agent container in place "
                                 "before a recovery starts (default: HEARTBEAT_TIMEOUT_S)")
        parser.add_argument("--backoff-max-s", type=float, default=30.0,
                            help="longest wait between attempts while the API cannot be reached")
        parser.add_argument("--label-selector", default=AGENT_POD_SELECTOR, help="which pods are agent pods")

    def handle(self, *args: Any, timeout_s: int, restart_grace_s: float | None, backoff_max_s: float,
               label_selector: str, **options: Any) -> None:
        if settings.PROVISIONING_PROFILE != "kubernetes":
            raise CommandError("watch_instances is for the kubernetes profile (PROVISIONING_PROFILE=kubernetes); "
                               "local instances are watched by the process that starts them (LOCAL_EXIT_NOTICE)")

        def say(message: str) -> None:
            self.stdout.write(message)
            self.stdout.flush()

        watcher = PodWatcher(
            timeout_s=timeout_s, backoff_max_s=backoff_max_s, label_selector=label_selector, progress=say,
            restart_grace_s=settings.HEARTBEAT_TIMEOUT_S if restart_grace_s is None else restart_grace_s)

        def stop(signum: int, _frame: object) -> None:
            say(f"{signal.Signals(signum).name}: stopping")
            watcher.stop()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
        say(f"watching agent pods ({label_selector}); restart grace {watcher.restart_grace_s:g} s")
        watcher.run()
        say(f"stopped at resourceVersion {watcher.resource_version}")
        sys.stdout.flush()
