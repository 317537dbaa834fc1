"""An example webhook receiver for the control plane's events: verify, de-duplicate, then act.

Standard library only, one file, so it can be copied into any service. Run it with the endpoint's secret
(shown once, when the endpoint was created)::

    WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py --port 8088

What it does with each ``POST``, in this order (docs/webhooks.md):

1. **Verify the signature** before reading anything: ``Webhook-Signature: t=<unix>,v1=<hex>`` where the hex
   is HMAC-SHA256 keyed with the secret over ``"<t>." + raw body``. Compare in constant time, and refuse a
   ``t`` more than ``WEBHOOK_TOLERANCE_S`` (default 300 s) away from now: a captured request cannot be
   replayed later. 400 on failure (the control plane retries; a forged request goes nowhere).
2. **De-duplicate on ``Webhook-Id``** (the event id, the same on every retry and replay): delivery is at
   least once, so the same event can arrive twice. This example remembers ids in memory; a real service
   stores them with its own writes, in one transaction.
3. **Answer 2xx quickly**, and do slow work afterwards: the sender waits at most a few seconds.

Accepted events are appended to ``WEBHOOK_EVENTS_FILE`` (JSON lines) when it is set, and printed otherwise.
The first line on stdout is ``listening on http://<host>:<port>``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY_BYTES = 1024 * 1024


def verify_signature(secret: str, header: str, body: bytes, *, now: float, tolerance_s: float) -> bool:
    """True when ``header`` is a valid, fresh signature of ``body`` under ``secret``."""
    timestamp, candidates = None, []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and timestamp is None:
            timestamp = value
        elif key == "v1":
            candidates.append(value)
    if timestamp is None or not timestamp.isdigit() or abs(now - int(timestamp)) > tolerance_s:
        return False
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)


class Receiver(ThreadingHTTPServer):
    def __init__(self, address: tuple[str, int], *, secret: str, tolerance_s: float, events_file: str) -> None:
        super().__init__(address, Handler)
        self.secret, self.tolerance_s, self.events_file = secret, tolerance_s, events_file
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def record(self, event: dict) -> None:  # type: ignore[type-arg]
        line = json.dumps(event, sort_keys=True)
        if self.events_file:
            with open(self.events_file, "a", encoding="utf-8") as out:
                out.write(line + "\n")
        else:
            print(line, flush=True)


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def _answer(self, status: int, message: str) -> None:
        body = json.dumps({"result": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - the http.server naming
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return self._answer(413, "too large")
        body = self.rfile.read(length)
        header = self.headers.get("Webhook-Signature", "")
        if not verify_signature(self.server.secret, header, body, now=time.time(),
                                tolerance_s=self.server.tolerance_s):
            return self._answer(400, "invalid or expired signature")
        event_id = self.headers.get("Webhook-Id", "")
        try:
            event = json.loads(body)
        except ValueError:
            return self._answer(400, "not JSON")
        if not event_id or event.get("id") != event_id:
            return self._answer(400, "Webhook-Id does not match the event")
        with self.server.lock:
            duplicate = event_id in self.server.seen
            self.server.seen.add(event_id)
            if not duplicate:
                self.server.record(event)
        return self._answer(200, "duplicate" if duplicate else "accepted")

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - keep stdout for events
        sys.stderr.write("webhook receiver: " + (format % args) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8088, help="0: any free port (printed)")
    args = parser.parse_args(argv)
    secret = os.environ.get("WEBHOOK_SECRET", "")
    if not secret.startswith("whsec_"):
        sys.exit("set WEBHOOK_SECRET to the endpoint's secret (whsec_..., shown when the endpoint was created)")
    server = Receiver((args.host, args.port), secret=secret,
                      tolerance_s=float(os.environ.get("WEBHOOK_TOLERANCE_S", "300")),
                      events_file=os.environ.get("WEBHOOK_EVENTS_FILE", ""))
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
