"""A tiny SMTP sink (`python -m agent_examples.peers.smtp`): accepts mail, appends it to a JSONL log.

Extension verb `XLOOKUP <message-id>` answers 250 with the delivery record when that Message-ID was
received, 550 otherwise: the provider lookup the effect ledger uses to resolve in-doubt emails.
Env: AGENT_SMTP_SINK_PORT (0 = ephemeral), AGENT_SMTP_SINK_LOG (JSONL path), AGENT_SINK_PORT_FILE.
"""

from __future__ import annotations

import email
import json
import os
import socketserver
import threading
import time
from email import policy
from typing import Any

from agent_examples.peers._serve import announce, serve_until_signal


class SmtpSinkServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], log_path: str | None) -> None:
        super().__init__(addr, SmtpHandler)
        self.log_path = log_path
        self.lock = threading.Lock()
        self.by_message_id: dict[str, dict[str, Any]] = {}
        self.deliveries = 0

    def deliver(self, mail_from: str, rcpt: list[str], data: bytes) -> dict[str, Any]:
        msg = email.message_from_bytes(data, policy=policy.default)
        mid = str(msg.get("Message-ID", "")).strip()
        record = {"message_id": mid, "from": mail_from, "to": rcpt, "subject": str(msg.get("Subject", "")),
                  "size": len(data), "at": time.time()}
        with self.lock:
            self.deliveries += 1
            record["n"] = self.deliveries
            self.by_message_id.setdefault(mid, record)
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
        return record


class SmtpHandler(socketserver.StreamRequestHandler):
    server: SmtpSinkServer

    def reply(self, line: str) -> None:
        self.wfile.write((line + "\r\n").encode())
        self.wfile.flush()

    def handle(self) -> None:
        self.reply("220 agent-runtime smtp sink")
        mail_from = ""
        rcpt: list[str] = []
        while True:
            raw = self.rfile.readline()
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\r\n")
            verb = line.split(" ", 1)[0].upper()
            arg = line[len(verb):].strip()
            if verb in ("HELO", "EHLO"):
                self.reply("250 sink")
            elif verb == "MAIL":
                mail_from, rcpt = arg.split(":", 1)[-1].strip("<> "), []
                self.reply("250 OK")
            elif verb == "RCPT":
                rcpt.append(arg.split(":", 1)[-1].strip("<> "))
                self.reply("250 OK")
            elif verb == "DATA":
                self.reply("354 End data with <CR><LF>.<CR><LF>")
                chunks: list[bytes] = []
                while True:
                    data_line = self.rfile.readline()
                    if not data_line:
                        return  # client vanished mid-DATA: nothing delivered
                    if data_line in (b".\r\n", b".\n"):
                        break
                    chunks.append(data_line[1:] if data_line.startswith(b"..") else data_line)
                rec = self.server.deliver(mail_from, rcpt, b"".join(chunks))
                self.reply(f"250 OK queued as {rec['n']}")
            elif verb == "XLOOKUP":
                with self.server.lock:
                    found = self.server.by_message_id.get(arg)
                self.reply(f"250 {json.dumps(found)}" if found else "550 unknown message-id")
            elif verb in ("RSET", "NOOP"):
                self.reply("250 OK")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("502 command not implemented")


def main() -> None:
    server = SmtpSinkServer(("127.0.0.1", int(os.environ.get("AGENT_SMTP_SINK_PORT", "0"))),
                            os.environ.get("AGENT_SMTP_SINK_LOG"))
    announce(server, "smtp sink")
    serve_until_signal(server)


if __name__ == "__main__":
    main()
