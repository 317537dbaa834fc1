"""An SMTP relay sink for tests and the demo (`python -m agent_examples.peers.smtp`), built on aiosmtpd.

It speaks standard SMTP only (no private verbs: no guarantee may depend on a protocol a real relay does not
have) and appends every message it receives to a JSONL log: message_id, from, to, subject, size, at, n.

`AGENT_SMTP_SINK_DROP_FILE`: while that file exists, a message is received and logged, then the connection is
closed without the 250 reply, so the sender cannot know it was accepted (the in-doubt case of a real relay
that crashes or loses the connection after DATA).

`AGENT_SMTP_SINK_MAILDIR`: each message is also filed into that Maildir folder (a "Sent"-style copy: `cur/`,
flagged seen; e.g. `<Maildir>/.Sent`, which dovecot serves as the mailbox "Sent"), before any reply, so a
dropped line still leaves it there; files take the folder's owner, as a delivery agent's would.
`AGENT_SMTP_SINK_MAILDIR_DELAY_S`: file it that many seconds later instead, from a background thread (an
archive that lags behind the relay). Env: AGENT_SMTP_SINK_PORT (0 = ephemeral), AGENT_SMTP_SINK_LOG (JSONL
path), AGENT_SINK_PORT_FILE. SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import email
import json
import mailbox
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
    """aiosmtpd handler: log each message (fsync'd before any reply) and file its copy, then answer 250 or
    drop the line."""

    def __init__(self, log_path: str | None, drop_file: str | None, maildir: str | None = None,
                 maildir_delay_s: float = 0.0) -> None:
        self.log_path = log_path
        self.drop_file = drop_file
        self.maildir = maildir
        self.maildir_delay_s = maildir_delay_s
        self.lock = threading.Lock()
        self.deliveries = 0

    def file_copy(self, data: bytes) -> None:
        """File the message into the Maildir folder as read mail (`cur/`, flag S), owned by the folder's owner."""
        assert self.maildir is not None
        folder = Path(self.maildir)
        folder.parent.mkdir(parents=True, exist_ok=True)
        box = mailbox.Maildir(folder, create=True)
        msg = mailbox.MaildirMessage(data)
        msg.set_subdir("cur")
        msg.add_flag("S")
        with self.lock:
            key = box.add(msg)
        owner = folder.stat()
        if os.geteuid() == 0 and owner.st_uid != 0:  # a root relay delivers as the mailbox's user, as an LDA does
            os.chown(folder / "cur" / f"{key}{box.colon}{msg.get_info()}", owner.st_uid, owner.st_gid)

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
        if self.maildir and self.maildir_delay_s > 0:
            timer = threading.Timer(self.maildir_delay_s, self.file_copy, (envelope.original_content or b"",))
            timer.daemon = True
            timer.start()
        elif self.maildir:
            self.file_copy(envelope.original_content or b"")
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
    handler = SinkHandler(os.environ.get("AGENT_SMTP_SINK_LOG"), os.environ.get("AGENT_SMTP_SINK_DROP_FILE"),
                          os.environ.get("AGENT_SMTP_SINK_MAILDIR") or None,
                          float(os.environ.get("AGENT_SMTP_SINK_MAILDIR_DELAY_S") or 0))
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
