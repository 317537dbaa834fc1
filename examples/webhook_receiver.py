"""An example webhook receiver for the control plane's events: verify, de-duplicate, then act.

Standard library only, one file, so it can be copied into any service. Run it with the endpoint's secret
(shown once, when the endpoint was created)::

    WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py --port 8088

What it does with each ``POST``, in this order (docs/webhooks.md):

1. **Verify the signature** before reading anything. Requests are signed as Standard Webhooks
   (https://www.standardwebhooks.com), so any of its libraries can do this step instead: ``webhook-signature``
   holds ``v1,<base64>`` entries (space-separated), each HMAC-SHA256 over
   ``"<webhook-id>.<webhook-timestamp>." + raw body``, keyed with the secret's part after ``whsec_``,
   base64-decoded. Compare in constant time, and refuse a ``webhook-timestamp`` more than
   ``WEBHOOK_TOLERANCE_S`` (default 300 s) away from now: a captured request cannot be replayed later. 400 on
   failure (the control plane retries; a forged request goes nowhere).
2. **De-duplicate on ``webhook-id``** (the event id, the same on every retry and replay): delivery is at
   least once, so the same event can arrive twice. This example remembers ids in memory; a real service
   stores them with its own writes, in one transaction.
3. **Answer 2xx quickly**, and do slow work afterwards: the sender waits at most a few seconds.

Accepted events are appended to ``WEBHOOK_EVENTS_FILE`` (JSON lines) when it is set, and printed otherwise.
The first line on stdout is ``listening on http://<host>:<port>``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY_BYTES = 1024 * 1024


def secret_key(secret: str) -> bytes:
    """The HMAC key: the base64 after ``whsec_`` (padding optional), decoded. ``ValueError`` otherwise."""
    tail = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(tail + "=" * (-len(tail) % 4), validate=True)
    except binascii.Error:
        key = b""
    if not secret.startswith("whsec_") or not key:
        raise ValueError("the secret is 'whsec_' followed by base64 (docs/webhooks.md)")
    return key


def verify_signature(key: bytes, headers: Mapping[str, str], body: bytes, *, now: float, tolerance_s: float) -> bool:
    """True when ``headers`` carry a valid, fresh Standard Webhooks signature of ``body`` under ``key``."""
    lower = {name.lower(): value for name, value in headers.items()}
    msg_id, timestamp = lower.get("webhook-id", ""), lower.get("webhook-timestamp", "")
    if not msg_id or not (timestamp.isascii() and timestamp.isdigit()) or abs(now - int(timestamp)) > tolerance_s:
        return False
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = base64.b64encode(mac).decode()
    found = False
    for entry in lower.get("webhook-signature", "").split():
        version, _, value = entry.partition(",")
        found |= version == "v1" and hmac.compare_digest(expected.encode(), value.encode())
    return found


class Receiver(ThreadingHTTPServer):
    def __init__(self, address: tuple[str, int], *, key: bytes, tolerance_s: float, events_file: str) -> None:
        super().__init__(address, Handler)
        self.key, self.tolerance_s, self.events_file = key, tolerance_s, events_file
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
        if not verify_signature(self.server.key, self.headers, body, now=time.time(),
                                tolerance_s=self.server.tolerance_s):
            return self._answer(400, "invalid or expired signature")
        event_id = self.headers.get("webhook-id", "")
        try:
            event = json.loads(body)
        except ValueError:
            return self._answer(400, "not JSON")
        if not event_id or event.get("id") != event_id:
            return self._answer(400, "webhook-id does not match the event")
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
    try:
        key = secret_key(os.environ.get("WEBHOOK_SECRET", ""))
    except ValueError as exc:
        sys.exit(f"set WEBHOOK_SECRET to the endpoint's secret (whsec_..., shown when the endpoint was created): {exc}")
    server = Receiver((args.host, args.port), key=key,
                      tolerance_s=float(os.environ.get("WEBHOOK_TOLERANCE_S", "300")),
                      events_file=os.environ.get("WEBHOOK_EVENTS_FILE", ""))
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
