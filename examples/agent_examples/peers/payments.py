"""A payment provider for tests and the demo (`python -m agent_examples.peers.payments`), following the
idempotency semantics Stripe documents for `POST /v1/charges`:

- the `Idempotency-Key` header makes a request safe to repeat: the same key again returns the first response
  (with `Idempotent-Replayed: true`), never a second charge;
- the same key with different parameters is refused with 400 and an `idempotency_error`;
- `GET /v1/charges/search?query=metadata['idempotency_key']:'KEY'` answers like Stripe's search API
  (`{"object": "search_result", "data": [...]}`), for clients that keep their key in the charge's metadata.

`AGENT_PAYMENTS_DEDUPE=0` switches the provider's de-duplication off (a provider that ignores the header), so
tests can show the ledger alone prevents a double charge. `AGENT_PAYMENTS_FAIL_FILE`: while that file exists
every request is answered 503 (a provider outage). `AGENT_PAYMENTS_SEARCH_LAG_S`: a charge shows up in search
results only that long after it was made (Stripe: "data is searchable in less than a minute"; the search is
eventually consistent). `AGENT_PAYMENTS_KILL_PID_FILE`: while that file exists, right after answering a new
charge the provider SIGKILLs the process whose pid it holds (the client dies after the provider's 200, before it
can record it). GET /stats: counts. Env: AGENT_PAYMENTS_PORT (0 =
ephemeral), AGENT_SINK_PORT_FILE.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from agent_examples.peers._serve import announce, serve_until_signal


class PaymentsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], dedupe: bool, search_lag_s: float = 0.0,
                 kill_pid_file: str | None = None) -> None:
        super().__init__(addr, PaymentsHandler)
        self.dedupe = dedupe
        self.search_lag_s = search_lag_s
        self.kill_pid_file = kill_pid_file
        self.made_at: dict[str, float] = {}  # charge id -> when it was made (monotonic), for the search lag
        self.kills = 0
        self.lock = threading.Lock()
        self.by_key: dict[str, dict[str, Any]] = {}
        self.charges: list[dict[str, Any]] = []
        self.posts = 0
        self.replays = 0


class PaymentsHandler(BaseHTTPRequestHandler):
    server: PaymentsServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        if self.path == "/stats":
            with srv.lock:
                counts: dict[str, int] = {}
                for c in srv.charges:
                    counts[c["idempotency_key"]] = counts.get(c["idempotency_key"], 0) + 1
                self.send_json(200, {"charges": len(srv.charges), "posts": srv.posts, "replays": srv.replays,
                                     "kills": srv.kills,
                                     "charges_by_key": counts, "charge_list": srv.charges})
            return
        if self._outage():
            return
        url = urlparse(self.path)
        if url.path == "/v1/charges/search":
            query = parse_qs(url.query).get("query", [""])[0]
            match = _SEARCH.fullmatch(query.strip())
            if not match:
                self.send_json(400, {"error": {"type": "invalid_request_error",
                                               "message": "query must be metadata['idempotency_key']:'...'"}})
                return
            indexed_before = time.monotonic() - srv.search_lag_s
            with srv.lock:
                data = [c for c in srv.charges if c.get("metadata", {}).get("idempotency_key") == match.group(1)
                        and srv.made_at[c["id"]] <= indexed_before]
            self.send_json(200, {"object": "search_result", "data": data, "has_more": False})
            return
        self.send_json(404, {"error": {"type": "invalid_request_error", "message": "not found"}})

    def _outage(self) -> bool:
        fail_file = os.environ.get("AGENT_PAYMENTS_FAIL_FILE")
        if fail_file and Path(fail_file).exists():
            self.send_json(503, {"error": {"type": "api_error", "message": "provider unavailable"}})
            return True
        return False

    def do_POST(self) -> None:  # noqa: N802
        srv = self.server
        if self._outage():
            return
        if self.path != "/v1/charges":
            self.send_json(404, {"error": {"type": "invalid_request_error", "message": "not found"}})
            return
        key = self.headers.get("Idempotency-Key", "")
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            amount = int(body["amount"])
        except (ValueError, KeyError, TypeError):
            self.send_json(400, {"error": {"type": "invalid_request_error", "message": "amount is required"}})
            return
        if amount <= 0:
            self.send_json(400, {"error": {"type": "invalid_request_error", "message": "amount must be positive"}})
            return
        params = {"amount": amount, "currency": body.get("currency", "EUR"), "to": body.get("to", "")}
        metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        with srv.lock:
            srv.posts += 1
            prev = srv.by_key.get(key) if key else None
            if prev is not None and srv.dedupe:
                if prev["params"] != params:
                    self.send_json(400, {"error": {"type": "idempotency_error", "message":
                                                   "Keys for idempotent requests can only be used with the same "
                                                   "parameters they were first used with."}})
                    return
                srv.replays += 1
                self.send_json(200, prev, {"Idempotent-Replayed": "true"})
                return
            charge = {"id": "ch_" + uuid.uuid4().hex[:16], "object": "charge", "idempotency_key": key,
                      "params": params, "amount": amount, "currency": params["currency"], "metadata": metadata,
                      "status": "succeeded"}
            srv.charges.append(charge)
            srv.made_at[charge["id"]] = time.monotonic()
            if key:
                srv.by_key[key] = charge
        self.send_json(200, charge)
        self._kill_client()

    def _kill_client(self) -> None:
        """The chaos switch: the client dies right after the provider's 200 (see the module docstring)."""
        srv = self.server
        if not srv.kill_pid_file:
            return
        try:
            self.wfile.flush()
            pid = int(Path(srv.kill_pid_file).read_text().strip())
            # The file may name a host that is gone and its pid reused (pid_max is often 32768): only an
            # agent-host is killed, never the database backend or worker that got the number next.
            if b"agent_runtime" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            return  # no pid file (the switch is off), or the process is gone already
        with srv.lock:
            srv.kills += 1


_SEARCH = re.compile(r"metadata\['idempotency_key'\]:'([^']*)'")


def main() -> None:
    dedupe = os.environ.get("AGENT_PAYMENTS_DEDUPE", "1") != "0"
    server = PaymentsServer(("127.0.0.1", int(os.environ.get("AGENT_PAYMENTS_PORT", "0"))), dedupe,
                            float(os.environ.get("AGENT_PAYMENTS_SEARCH_LAG_S", "0") or 0),
                            os.environ.get("AGENT_PAYMENTS_KILL_PID_FILE") or None)
    announce(server, "payments stub")
    serve_until_signal(server)


if __name__ == "__main__":
    main()
