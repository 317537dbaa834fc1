"""``manage.py supervisor_events``: supervisord's event listener for the local stack (``scripts/services.py``).

supervisord starts it beside web, worker, beat and the watcher and sends it every process state change
(the event listener protocol on stdin/stdout: stdout is the protocol, so nothing else is ever printed there).
For each unexpected exit it

- marks the service down at once in its liveness record (``controlplane.liveness``): ``/readyz`` and the
  staff dashboard say so with the reason before the supervisor's restart is even under way;
- writes a line to ``var/log/restarts.log``;

and once the restarted process runs, one audit row ``service.restart`` (service, the old and new pid, why
it exited, how long it was down), which the staff dashboard's overview lists. A service the supervisor gave up
on (too many quick failures) is ``service.gave_up``. Why a process exited comes from supervisord's own log
line ("terminated by SIGKILL", "exit status 1"): its events carry no exit status.
"""

from __future__ import annotations

import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from controlplane.liveness import SERVICES, service_exited, service_started_at
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import ActorKind

SUPERVISOR = Actor(kind=ActorKind.SYSTEM, label="supervisor")


def _parse(line: str) -> dict[str, str]:
    return dict(token.split(":", 1) for token in line.split() if ":" in token)


def exit_reason(supervisord_log: Path, name: str) -> str:
    """The reason supervisord logged for ``name``'s latest exit ("terminated by SIGKILL", "exit status 1")."""
    try:
        with supervisord_log.open("rb") as log:
            log.seek(max(0, supervisord_log.stat().st_size - 65536))
            tail = log.read().decode(errors="replace")
    except OSError:
        return "exited"
    found = re.findall(rf"exited: {re.escape(name)} \((.*?)(?:; not expected|; expected)?\)", tail)
    return found[-1] if found else "exited"


def last_spawned_pid(supervisord_log: Path, name: str) -> int:
    """The pid supervisord last logged for ``name`` ("spawned: 'worker' with pid 123"); 0 when none is found.

    A BACKOFF event (the process exited before its startsecs) carries no pid; the log line of its spawn does.
    """
    try:
        with supervisord_log.open("rb") as log:
            log.seek(max(0, supervisord_log.stat().st_size - 65536))
            tail = log.read().decode(errors="replace")
    except OSError:
        return 0
    found = re.findall(rf"spawned: '{re.escape(name)}' with pid (\d+)", tail)
    return int(found[-1]) if found else 0


class Command(BaseCommand):
    help = "supervisord's event listener: records each crash and restart of the local services (audit, log)."

    def handle(self, *args: Any, **options: Any) -> None:
        var = Path(settings.VAR_DIR)
        self.supervisord_log = var / "log" / "supervisord.log"
        self.restarts_log = var / "log" / "restarts.log"
        self.down: dict[str, dict[str, Any]] = {}  # service -> the exit waiting for its restart
        self.host = socket.gethostname()
        stdin, stdout = sys.stdin, sys.stdout
        while True:
            stdout.write("READY\n")
            stdout.flush()
            header_line = stdin.readline()
            if not header_line:
                return  # supervisord is gone
            headers = _parse(header_line)
            payload = stdin.read(int(headers.get("len", "0")))
            try:
                self.on_event(headers.get("eventname", ""), _parse(payload.split("\n", 1)[0]))
            except Exception as exc:  # one event that cannot be recorded never stops the next one's
                self.stderr.write(f"supervisor_events: {headers.get('eventname')}: {type(exc).__name__}: {exc}")
            stdout.write("RESULT 2\nOK")
            stdout.flush()

    def _line(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        with open(self.restarts_log, "a") as log:
            log.write(f"{stamp} {text}\n")

    def on_event(self, event: str, body: dict[str, str]) -> None:
        name, pid = body.get("processname", ""), int(body.get("pid") or 0)
        if event == "PROCESS_STATE_EXITED":  # on its own: a stop the supervisor was asked for is STOPPED
            reason = exit_reason(self.supervisord_log, name)
            if name in SERVICES:
                service_exited(name, pid=pid, host=self.host, detail=reason)
            first = self.down.setdefault(name, {"pid": pid, "reason": reason, "at": time.time(), "attempts": 0})
            first["attempts"] += 1
            self._line(f"{name}: pid {pid} {reason}; the supervisor restarts it")
        elif event == "PROCESS_STATE_BACKOFF":
            # Exited before it counted as running (startsecs): supervisord waits a little longer before each next
            # try. It is down all the same: a worker killed in its first seconds may have sent heartbeats already.
            reason = exit_reason(self.supervisord_log, name)
            pid = last_spawned_pid(self.supervisord_log, name)
            if name in SERVICES and pid:
                service_exited(name, pid=pid, host=self.host, detail=reason)
            first = self.down.setdefault(name, {"pid": pid, "reason": reason, "at": time.time(), "attempts": 0})
            first["attempts"] += 1
            if first["attempts"] == 1 and pid:
                self._line(f"{name}: pid {pid} {reason}; the supervisor restarts it")
            else:
                self._line(f"{name}: {reason} before it was up (try {first['attempts']}); retrying with backoff")
        elif event == "PROCESS_STATE_STARTING" and name in self.down:
            self.down[name].setdefault("restarted_at", time.time())
        elif event == "PROCESS_STATE_RUNNING":
            # RUNNING: the process has stayed up for startsecs (5 s). The worker and beat were back before
            # that: their first heartbeat says when.
            exited = self.down.pop(name, None)
            if exited is None:
                self._line(f"{name}: running (pid {pid})")
                return
            delay_s = round(exited.get("restarted_at", time.time()) - exited["at"], 1)
            ready_at = service_started_at(name, pid=pid, host=self.host) if name in SERVICES else None
            up_s = round(ready_at - exited["at"], 1) if ready_at else None
            self._line(f"{name}: restarted as pid {pid} {delay_s} s after pid {exited['pid']} {exited['reason']}"
                       + (f"; up again (first heartbeat) {up_s} s after the exit" if up_s is not None else "")
                       + f" ({exited['attempts']} attempt(s))")
            close_old_connections()
            audit_record(actor=SUPERVISOR, action=AuditAction.SERVICE_RESTART, data={
                "service": name, "old_pid": exited["pid"], "new_pid": pid, "reason": exited["reason"],
                "restart_delay_s": delay_s, "up_after_s": up_s, "attempts": exited["attempts"]})
        elif event == "PROCESS_STATE_FATAL":
            exited = self.down.pop(name, {"reason": "exited", "attempts": 0})
            self._line(f"{name}: the supervisor gave up after {exited['attempts']} quick failure(s) "
                       f"({exited['reason']}); see var/log/{name}.log, then `make run`")
            close_old_connections()
            audit_record(actor=SUPERVISOR, action=AuditAction.SERVICE_GAVE_UP, data={
                "service": name, "reason": exited["reason"], "attempts": exited["attempts"]})
