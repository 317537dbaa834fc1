"""A payment-provider stub (`python -m agent_runtime.sinks.payments`) that honours idempotency keys.

POST /v1/payments (header Idempotency-Key, JSON {amount, currency, to}): creates a charge once per key;
the same key again returns the original charge; the same key with different parameters is refused (422),
as real providers do. GET /v1/payments/by-key/<key>: the charge or 404 (in-doubt resolution).
GET /stats: counts. Env: AGENT_PAYMENTS_PORT (0 = ephemeral), AGENT_PAYMENTS_DEDUPE=0 turns the
provider's own dedupe off (so tests can prove the ledger alone prevents double payment),
AGENT_SINK_PORT_FILE.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent_runtime.sinks._serve import announce, serve_until_signal


class PaymentsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], dedupe: bool) -> None:
        super().__init__(addr, PaymentsHandler)
        self.dedupe = dedupe
        self.lock = threading.Lock()
        self.by_key: dict[str, dict[str, Any]] = {}
        self.charges: list[dict[str, Any]] = []
        self.posts = 0
        self.replays = 0


class PaymentsHandler(BaseHTTPRequestHandler):
    server: PaymentsServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return

    def send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
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
                                     "charges_by_key": counts, "charge_list": srv.charges})
            return
        if self.path.startswith("/v1/payments/by-key/"):
            key = self.path.rsplit("/", 1)[-1]
            with srv.lock:
                found = srv.by_key.get(key)
            self.send_json(200 if found else 404, found or {"error": "no such idempotency key"})
            return
        self.send_json(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        srv = self.server
        if self.path != "/v1/payments":
            self.send_json(404, {"error": "not found"})
            return
        key = self.headers.get("Idempotency-Key", "")
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            amount = int(body["amount"])
        except (ValueError, KeyError, TypeError):
            self.send_json(400, {"error": "bad request"})
            return
        if not key or amount <= 0:
            self.send_json(400, {"error": "Idempotency-Key and positive amount required"})
            return
        params = {"amount": amount, "currency": body.get("currency", "EUR"), "to": body.get("to", "")}
        with srv.lock:
            srv.posts += 1
            prev = srv.by_key.get(key)
            if prev is not None and srv.dedupe:
                if prev["params"] != params:
                    self.send_json(422, {"error": "idempotency key reused with different parameters"})
                    return
                srv.replays += 1
                self.send_json(200, prev)
                return
            charge = {"id": "ch_" + uuid.uuid4().hex[:16], "idempotency_key": key, "params": params,
                      "status": "succeeded"}
            srv.charges.append(charge)
            srv.by_key[key] = charge
        self.send_json(201, charge)


def main() -> None:
    dedupe = os.environ.get("AGENT_PAYMENTS_DEDUPE", "1") != "0"
    server = PaymentsServer(("127.0.0.1", int(os.environ.get("AGENT_PAYMENTS_PORT", "0"))), dedupe)
    announce(server, "payments stub")
    serve_until_signal(server)


if __name__ == "__main__":
    main()
