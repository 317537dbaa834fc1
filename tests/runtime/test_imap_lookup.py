"""`ImapLookup` against a real dovecot, and an email in doubt settled by it inside a real agent-host.

The peers are real processes and are counted at their side: the aiosmtpd relay sink (its JSONL log is what it
received) files each message into the Maildir folder dovecot serves as "Sent" (AGENT_SMTP_SINK_MAILDIR), before
any reply; its drop switch makes the email in doubt (received, then the line drops before the 250). Dovecot is
tests/dovecot.py's private server; the host reads the IMAP password from its environment credentials.
"""

from __future__ import annotations

import os
import socket
import ssl
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_runtime.db import connect
from agent_runtime.effects.config import IMAP_CONSISTENCY_S, adapter_from_spec, adapters_from_env
from agent_runtime.effects.imap import ImapLookup
from agent_runtime.effects.ledger import EffectLedger, idempotency_key
from agent_runtime.effects.smtp import SmtpEffect, message_id_for
from agent_runtime.errors import ConfigError
from agent_runtime.host.credentials import InMemoryCredentialSource
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate
from tests.dovecot import Dovecot, start_dovecot

from .conftest import ROOT, HostRunner, Proc, Sinks, TenantDB, make_env
from .test_host import wait_status

MAIL = {"from": "agent@tenant.test", "to": "someone@x.test", "subject": "hello", "body": "hi"}


@pytest.fixture(scope="module")
def dovecot() -> Iterator[Dovecot]:
    server = start_dovecot("imap-lookup")
    try:
        yield server
    finally:
        server.stop()


def start_relay(tmp: Path, maildir: Path, delay_s: float = 0.0) -> Sinks:
    """The smtp peer alone, filing into `maildir` (after `delay_s`: an archive that lags)."""
    tmp.mkdir(parents=True, exist_ok=True)
    port_file = tmp / "smtp.port"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update({"PYTHONPATH": str(ROOT), "AGENT_SMTP_SINK_LOG": str(tmp / "smtp.jsonl"),
                "AGENT_SMTP_SINK_DROP_FILE": str(tmp / "smtp.drop"), "AGENT_SMTP_SINK_MAILDIR": str(maildir),
                "AGENT_SMTP_SINK_MAILDIR_DELAY_S": str(delay_s), "AGENT_SINK_PORT_FILE": str(port_file)})
    proc = Proc([sys.executable, "-m", "agent_examples.peers.smtp"], env, tmp / "smtp.log")
    deadline = time.monotonic() + 10
    while not port_file.exists():
        assert time.monotonic() < deadline and proc.p.poll() is None, f"smtp sink did not start:\n{proc.output()}"
        time.sleep(0.02)
    return Sinks(f"smtp://127.0.0.1:{int(port_file.read_text())}", "", tmp / "smtp.jsonl", [proc],
                 tmp / "payments.fail", tmp / "smtp.drop")


@pytest.fixture
def relay(tmp_path: Path, dovecot: Dovecot) -> Iterator[Sinks]:
    sinks = start_relay(tmp_path / "relay", dovecot.folder("Sent"))
    try:
        yield sinks
    finally:
        sinks.stop()


@pytest.fixture
def refused_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)  # connections are accepted by the kernel, and nobody ever says a word
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _url(d: Dovecot, mailbox: str = "/Sent", port: int | None = None, scheme: str = "imap", query: str = "") -> str:
    return f"{scheme}://{d.user}:imap@127.0.0.1:{port or d.port}{mailbox}{query}"


def _creds(d: Dovecot) -> InMemoryCredentialSource:
    return InMemoryCredentialSource({"imap": d.password})


def _key() -> str:
    """A key as the ledger derives it (its Message-ID is long enough to be folded in the header)."""
    return idempotency_key(uuid.uuid4(), "notify", "email")


def _filed(d: Dovecot, message_id: str) -> int:
    """Copies of `message_id` in the Sent folder, counted in the files dovecot serves."""
    return sum(1 for sub in ("cur", "new") for f in (d.folder("Sent") / sub).iterdir()
               if message_id.encode() in f.read_bytes().replace(b"\r\n ", b" ").replace(b"\n ", b" "))


# --- ImapLookup over the wire ----------------------------------------------------------------------------------

def test_lookup_finds_what_the_relay_filed_and_nothing_else(dovecot: Dovecot, relay: Sinks) -> None:
    key, other = _key(), _key()
    sent = SmtpEffect(relay.smtp_url).perform(key, MAIL)
    mid = message_id_for(key)
    assert sent["message_id"] == mid and [m["message_id"] for m in relay.emails()] == [mid]
    assert _filed(dovecot, mid) == 1
    lookup = ImapLookup(_url(dovecot), credentials=_creds(dovecot))
    found = lookup(mid)
    assert found.outcome == "found", found
    assert found.result is not None and (found.result["message_id"], found.result["mailbox"]) == (mid, "Sent")
    assert isinstance(found.result["uid"], int) and found.result["uid"] > 0
    assert lookup(message_id_for(other)).outcome == "absent"
    # The same answer without a path (the mailbox defaults to "Sent"), over IMAPS and through STARTTLS, with the
    # server's certificate verified; and through SmtpEffect, which turns the ledger's key into the Message-ID.
    tls = ssl.create_default_context(cafile=str(dovecot.cafile))
    for url in (_url(dovecot, mailbox=""), _url(dovecot, scheme="imaps", port=dovecot.tls_port),
                _url(dovecot, query="?starttls=1")):
        assert ImapLookup(url, credentials=_creds(dovecot), ssl_context=tls)(mid) == found, url
    email = SmtpEffect(relay.smtp_url, lookup=lookup, lookup_consistency_s=5)
    assert email.supports_lookup and email.lookup(key) == found and email.lookup(other).outcome == "absent"
    assert _filed(dovecot, mid) == 1 and len(relay.emails()) == 1  # looking never files or sends anything


def test_an_error_is_never_absent_and_never_shows_the_password(dovecot: Dovecot, relay: Sinks, refused_port: int,
                                                               silent_port: int) -> None:
    key = _key()
    SmtpEffect(relay.smtp_url).perform(key, MAIL)
    mid = message_id_for(key)
    wrong = InMemoryCredentialSource({"imap": "not-the-" + dovecot.password})
    cases = {
        "wrong password": ImapLookup(_url(dovecot), credentials=wrong),
        "port refused": ImapLookup(_url(dovecot, port=refused_port), credentials=_creds(dovecot)),
        "no such mailbox": ImapLookup(_url(dovecot, mailbox="/Archive"), credentials=_creds(dovecot)),
        "credential revoked": ImapLookup(_url(dovecot), credentials=InMemoryCredentialSource()),
        # The test CA is not in the system's store: an unverifiable server is not asked.
        "certificate unverified": ImapLookup(_url(dovecot, scheme="imaps", port=dovecot.tls_port),
                                             credentials=_creds(dovecot)),
        "STARTTLS unverified": ImapLookup(_url(dovecot, query="?starttls=1"), credentials=_creds(dovecot)),
        "no greeting (timeout)": ImapLookup(_url(dovecot, port=silent_port), credentials=_creds(dovecot),
                                            timeout_s=0.5),
    }
    answers = {what: lookup(mid) for what, lookup in cases.items()}
    for what, answer in answers.items():
        assert answer.outcome == "unknown", (what, answer)
        assert dovecot.password not in answer.detail and dovecot.password not in repr(cases[what]), what
    assert "AUTHENTICATIONFAILED" in answers["wrong password"].detail
    assert "doesn't exist" in answers["no such mailbox"].detail
    assert "CERTIFICATE_VERIFY_FAILED" in answers["certificate unverified"].detail
    assert "CERTIFICATE_VERIFY_FAILED" in answers["STARTTLS unverified"].detail
    assert ImapLookup(_url(dovecot), credentials=_creds(dovecot))(mid).outcome == "found"  # and it is there
    with pytest.raises(ValueError, match="not a Message-ID"):
        ImapLookup(_url(dovecot), credentials=_creds(dovecot))('<a" OR ALL "@x>')


def test_a_lagging_archive_is_absent_until_filed(dovecot: Dovecot, tmp_path: Path) -> None:
    lagging = start_relay(tmp_path / "lagging", dovecot.folder("Sent"), delay_s=1.0)
    try:
        key = _key()
        t0 = time.monotonic()
        SmtpEffect(lagging.smtp_url).perform(key, MAIL)
        lookup = ImapLookup(_url(dovecot), credentials=_creds(dovecot))
        assert lookup(message_id_for(key)).outcome == "absent"
        assert len(lagging.emails()) == 1  # the relay has it; its archive does not yet
        while (answer := lookup(message_id_for(key))).outcome != "found":
            assert answer.outcome == "absent" and time.monotonic() - t0 < 10, answer
            time.sleep(0.1)
        assert time.monotonic() - t0 >= 1.0
    finally:
        lagging.stop()


# --- configuration -----------------------------------------------------------------------------------------------

def test_configuration_of_the_lookup(dovecot: Dovecot, relay: Sinks) -> None:
    creds = _creds(dovecot)
    spec = {"type": "smtp", "url": relay.smtp_url, "imap_lookup": {"url": _url(dovecot), "consistency_window_s": 30}}
    email = adapter_from_spec("email", spec, creds)
    assert email.supports_lookup and email.lookup_consistency_s == 30.0
    key = _key()
    email.perform(key, MAIL)
    assert email.lookup(key).outcome == "found"
    default = adapter_from_spec("email", {**spec, "imap_lookup": {"url": _url(dovecot)}}, creds)
    assert default.lookup_consistency_s == IMAP_CONSISTENCY_S == 60.0
    assert not adapter_from_spec("email", {"type": "smtp", "url": relay.smtp_url}, creds).supports_lookup
    for bad, message in (
        ({"url": "http://x/Sent"}, "imap:// or imaps://"),
        ({"url": "imap://127.0.0.1/Sent"}, "the user and the credential"),
        ({"url": "imaps://u:c@h/Sent?starttls=1"}, "TLS from the start"),
        ({"url": "imap://u:c@h/Sent?tls=1"}, "only option"),
        ({"url": _url(dovecot), "consistency_window_s": -1}, "0 or more seconds"),
        ({"url": _url(dovecot), "consistency_window_s": "60"}, "0 or more seconds"),
        ({"url": _url(dovecot), "window": 5}, "unknown 'imap_lookup' options"),
        ("imap://u:c@h/Sent", "must be an object"),
    ):
        with pytest.raises(ConfigError, match=message):
            adapter_from_spec("email", {**spec, "imap_lookup": bad}, creds)
    with pytest.raises(ConfigError, match="consistency_window_s' only"):
        adapter_from_spec("email", {**spec, "lookup_consistency_s": 5}, creds)
    # The AGENT_SMTP_URL shortcut and its two variables.
    env = {"AGENT_SMTP_URL": relay.smtp_url, "AGENT_SMTP_IMAP_LOOKUP_URL": _url(dovecot)}
    assert adapters_from_env(env, creds)["email"].lookup_consistency_s == IMAP_CONSISTENCY_S
    shortcut = adapters_from_env({**env, "AGENT_SMTP_IMAP_LOOKUP_WINDOW_S": "0"}, creds)["email"]
    assert shortcut.supports_lookup and shortcut.lookup_consistency_s == 0 and shortcut.lookup(key).outcome == "found"
    for bad_env, message in (({"AGENT_SMTP_IMAP_LOOKUP_URL": _url(dovecot)}, "need AGENT_SMTP_URL"),
                             ({**env, "AGENT_SMTP_IMAP_LOOKUP_WINDOW_S": "soon"}, "number of seconds"),
                             ({**env, "AGENT_SMTP_IMAP_LOOKUP_WINDOW_S": "-1"}, "0 or more seconds"),
                             ({"AGENT_SMTP_URL": relay.smtp_url, "AGENT_SMTP_IMAP_LOOKUP_WINDOW_S": "5"},
                              "needs the URL")):
        with pytest.raises(ConfigError, match=message):
            adapters_from_env(bad_env, creds)


# --- an email in doubt in a real agent-host ------------------------------------------------------------------

def _email_in_doubt(tenant_db: TenantDB, hosts: HostRunner, env: dict[str, str], relay: Sinks
                    ) -> tuple[str, Any, int, str]:
    """The `multi` agent sends one email while the relay drops the line after DATA; returns the task's final
    status, the effect's record, how many times the step waited on it, and the host's output."""
    relay.smtp_drop_file.touch()  # on for the whole run: whatever is sent again is received again, and counted
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as conn:
        migrate(conn, tenant_db.schema)
        tid = tasks.submit(conn, "multi", {"emails": 1})
        proc = hosts.start(env)
        status = wait_status(tenant_db, tid, ("done", "blocked", "failed"), timeout=20)
        ledger = EffectLedger(conn, env["AGENT_TENANT_ID"])
        rec = ledger.get(ledger.key_for(tid, "notify", "email"))
        row = conn.execute("SELECT count(*) FROM step_events WHERE task_id = %s AND event = 'waiting'",
                           (tid,)).fetchone()
        task = tasks.get(conn, tid)
    assert task is not None and rec is not None
    if status == "blocked":
        assert task.blocked_reason == "effect_in_doubt", task
    return status, rec, int(row[0]) if row else 0, proc.output()


def _host_env(tenant_db: TenantDB, tmp_path: Path, relay: Sinks, d: Dovecot, **extra: str) -> dict[str, str]:
    return make_env(tenant_db, tmp_path, AGENT_APP="tests.runtime.agents:AGENTS", AGENT_SMTP_URL=relay.smtp_url,
                    AGENT_EFFECT_RETRY_MAX_S="0.5", AGENT_CREDENTIAL_IMAP=d.password, **extra)


@pytest.mark.parametrize("imap_lookup", [True, False], ids=["with_imap_lookup", "without"])
def test_email_in_doubt_is_settled_by_the_sent_folder_else_blocked_for_a_human(
        tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner, dovecot: Dovecot, relay: Sinks,
        imap_lookup: bool) -> None:
    extra = {"AGENT_SMTP_IMAP_LOOKUP_URL": _url(dovecot)} if imap_lookup else {}
    env = _host_env(tenant_db, tmp_path, relay, dovecot, **extra)
    status, rec, waits, output = _email_in_doubt(tenant_db, hosts, env, relay)
    mid = message_id_for(rec.idem_key)
    assert [m["message_id"] for m in relay.emails()] == [mid]  # exactly one email reached the relay
    assert _filed(dovecot, mid) == 1
    if imap_lookup:
        assert status == "done", output[-3000:]
        assert (rec.state, rec.resolution) == ("committed", "provider_lookup:found")
        assert rec.result is not None and (rec.result["message_id"], rec.result["mailbox"]) == (mid, "Sent")
        assert waits >= 1  # the send's outcome was unknown: the step waited, then the lookup settled it
    else:
        assert status == "blocked", output[-3000:]
        assert (rec.state, rec.resolution) == ("blocked", "no_provider_lookup")
    assert dovecot.password not in output


def test_absent_inside_the_window_is_not_trusted(tenant_db: TenantDB, tmp_path: Path, hosts: HostRunner,
                                                 dovecot: Dovecot) -> None:
    """The archive files the copy 2 s after the relay took it: the lookups before then say "absent", which the
    5 s window does not trust (a repeat would be a second email); the one after it finds the message."""
    lagging = start_relay(tmp_path / "lagging", dovecot.folder("Sent"), delay_s=2.0)
    try:
        env = _host_env(tenant_db, tmp_path, lagging, dovecot, AGENT_SMTP_IMAP_LOOKUP_URL=_url(dovecot),
                        AGENT_SMTP_IMAP_LOOKUP_WINDOW_S="5")
        status, rec, waits, output = _email_in_doubt(tenant_db, hosts, env, lagging)
        assert status == "done", output[-3000:]
        assert (rec.state, rec.resolution) == ("committed", "provider_lookup:found")
        assert [m["message_id"] for m in lagging.emails()] == [message_id_for(rec.idem_key)]
        assert waits >= 2  # the unknown send, then at least one "absent" inside the window
    finally:
        lagging.stop()
