"""An SMTP relay sink for tests and the demo (`python -m agent_examples.peers.smtp`), built on aiosmtpd.

It speaks standard SMTP only (no private verbs: no guarantee may depend on a protocol a real relay does not
have) and appends every message it receives to a JSONL log: message_id, from, to, subject, size, at, n.

`AGENT_SMTP_SINK_DROP_FILE`: while that file exists, a message is received and logged, then the connection is
closed without the 250 reply, so the sender cannot know it was accepted (the in-doubt case of a real relay
that crashes or loses the connection after DATA). Env: AGENT_SMTP_SINK_PORT (0 = ephemeral),
AGENT_SMTP_SINK_LOG (JSONL path), AGENT_SINK_PORT_FILE. SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import email
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable
from email import policy
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from agent_examples.peers._serve import announce_port

__all__ = ["SinkHandler", "SinkRelay", "main"]


class SinkHandler:
    """aiosmtpd handler: log each message (fsync'd before any reply), then answer 250 or drop the line."""

    def __init__(self, log_path: str | None, drop_file: str | None) -> None:
        self.log_path = log_path
        self.drop_file = drop_file
        self.lock = threading.Lock()
        self.deliveries = 0

    def record(self, envelope: Envelope) -> dict[str, Any]:
        data = envelope.original_content or b""
        msg = email.message_from_bytes(data, policy=policy.default)
        record: dict[str, Any] = {"message_id": str(msg.get("Message-ID", "")).strip(),
                                  "from": envelope.mail_from, "to": list(envelope.rcpt_tos),
                                  "subject": str(msg.get("Subject", "")), "size": len(data), "at": time.time()}
        with self.lock:
            self.deliveries += 1
            record["n"] = self.deliveries
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
        return record

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
        rec = self.record(envelope)
        if self.drop_file and Path(self.drop_file).exists() and server.transport is not None:
            # Accepted and logged, but the sender never hears so: abort the connection and wait to be
            # cancelled by aiosmtpd's connection_lost, so no reply is ever written.
            server.transport.abort()
            await asyncio.Event().wait()
        return f"250 OK queued as {rec['n']}"


class SinkRelay(Controller):
    """aiosmtpd's threaded Controller on a socket bound up front, so port 0 gives a known ephemeral port."""

    def __init__(self, handler: SinkHandler, port: int) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        super().__init__(handler, hostname="127.0.0.1", port=self._sock.getsockname()[1],
                         server_hostname="agent-runtime-smtp-sink", ident="agent-runtime smtp sink")

    def _create_server(self) -> Awaitable[asyncio.AbstractServer]:
        return self.loop.create_server(self._factory_invoker, sock=self._sock)


def main() -> None:
    handler = SinkHandler(os.environ.get("AGENT_SMTP_SINK_LOG"), os.environ.get("AGENT_SMTP_SINK_DROP_FILE"))
    relay = SinkRelay(handler, int(os.environ.get("AGENT_SMTP_SINK_PORT", "0")))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    relay.start()  # the relay's event loop runs in its own thread; this one waits for a signal
    announce_port(relay.port, "smtp sink")
    try:
        while not stop.wait(0.2):
            pass
    finally:
        relay.stop()


if __name__ == "__main__":
    main()
