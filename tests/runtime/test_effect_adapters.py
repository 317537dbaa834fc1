"""The built-in effect adapters against real providers, over the wire: the Stripe-semantics payments peer, the
aiosmtpd relay and a Standard Webhooks receiver; provider outages longer than the step timeout against a real
agent-host; several effects of one kind in a step and explicit keys through `Context.effect`.

Every provider is a real peer (a process from `start_sinks`, or a small HTTP server in this module); outages
are the peers' own switches (503 while a file exists, a relay that drops the line after DATA, a port that
refuses connections), never a patched function.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest

from agent_runtime.db import connect
from agent_runtime.effects.base import LookupResult, ProviderRejected
from agent_runtime.effects.ledger import EffectLedger, explicit_idempotency_key
from agent_runtime.effects.smtp import SmtpEffect, message_id_for
from agent_runtime.effects.webhook import WebhookEffect, sign_webhook, verify_webhook
from agent_runtime.errors import EffectFailed, EffectInDoubt, TaskBlocked
from agent_runtime.host.credentials import InMemoryCredentialSource
from agent_runtime.host.runner import Runtime, run_task
from agent_runtime.sdk import Agent, Context
from agent_runtime.state import tasks
from agent_runtime.state.migrations import migrate

from .agents import multi
from .conftest import HostRunner, Sinks, TenantDB, payment_adapter
from .test_host import wait_status
from .test_ledger_semantic_reasoning import _intent

CHARGE = {"amount": 4200, "currency": "EUR", "to": "acct_outage"}


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but not listening: every connection is refused, and no other process can take it meanwhile."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _post_charge(base_url: str, key: str, params: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
    """A bare client of the payments peer, to read the headers the adapter does not return."""
    req = urllib.request.Request(f"{base_url}/v1/charges", data=json.dumps(params).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": key})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status, dict(resp.headers), json.loads(resp.read())


# --- HttpIdempotentEffect against the Stripe-semantics payments peer ---------------------------------------

def test_http_provider_dedupes_by_idempotency_key_and_refuses_other_params(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    pay = rt.effects["payment"]
    tid = tasks.submit(rt.conn, "demo", {})
    args = {"amount": 700, "currency": "EUR", "to": "acct_a"}
    first = rt.ledger.run(tid, "pay", "payment", pay, args)
    key = rt.ledger.key_for(tid, "pay", "payment")
    assert first["idempotency_key"] == key  # what the provider read from the Idempotency-Key header
    assert first["metadata"]["idempotency_key"] == key  # and kept where a search can find it
    # The same key again is answered from the provider's record, flagged as a replay, never a second charge.
    assert pay.perform(key, args)["id"] == first["id"]
    status, headers, body = _post_charge(sinks.payments_url, key, args)
    assert status == 200 and headers.get("Idempotent-Replayed") == "true" and body["id"] == first["id"]
    stats = sinks.payment_stats()
    assert (stats["charges"], stats["posts"], stats["replays"]) == (1, 3, 2)
    # The same key with other parameters is refused by the provider: through the ledger a recorded failure.
    key2 = rt.ledger.key_for(tid, "pay2", "payment")
    pay.perform(key2, args)  # the key was already used, with other parameters
    with pytest.raises(ProviderRejected, match="idempotency_error"):
        pay.perform(key2, {**args, "amount": 701})
    with pytest.raises(EffectFailed, match="idempotency_error"):
        rt.ledger.run(tid, "pay2", "payment", pay, {**args, "amount": 701})
    rec = rt.ledger.get(key2)
    assert rec is not None and rec.state == "failed" and "idempotency_error" in rec.result["error"]
    posts = sinks.payment_stats()["posts"]
    with pytest.raises(EffectFailed, match="refused earlier"):
        rt.ledger.run(tid, "pay2", "payment", pay, {**args, "amount": 701})
    assert sinks.payment_stats()["posts"] == posts  # a recorded refusal is not asked again
    assert sinks.payment_stats()["charges"] == 2


def test_http_without_provider_dedupe_the_ledger_and_lookup_keep_one_charge(runtime: Runtime,
                                                                              nodedupe: Sinks) -> None:
    rt = runtime
    pay = payment_adapter(nodedupe.payments_url)
    tid = tasks.submit(rt.conn, "demo", {})
    # Intent committed, the charge landed, the process died before recording it: the lookup finds it.
    landed = {"amount": 1000, "currency": "EUR", "to": "acct_landed"}
    key = _intent(rt, tid, "pay", "payment", landed)
    charge = pay.perform(key, landed)
    assert rt.ledger.run(tid, "pay", "payment", pay, landed)["id"] == charge["id"]
    assert rt.ledger.run(tid, "pay", "payment", pay, landed)["id"] == charge["id"]
    rec = rt.ledger.get(key)
    assert rec is not None and rec.state == "committed" and rec.resolution == "provider_lookup:found"
    assert nodedupe.payment_stats()["posts"] == 1
    # Intent committed, the call never made: the lookup says absent and the ledger performs it once.
    never = {"amount": 2000, "currency": "EUR", "to": "acct_never"}
    key2 = _intent(rt, tid, "pay2", "payment", never)
    assert rt.ledger.run(tid, "pay2", "payment", pay, never)["idempotency_key"] == key2
    assert rt.ledger.run(tid, "pay2", "payment", pay, never)["idempotency_key"] == key2
    assert rt.ledger.get(key2).resolution == "provider_lookup:absent"
    stats = nodedupe.payment_stats()
    assert stats["charges_by_key"] == {key: 1, key2: 1} and stats["posts"] == 2
    # This provider really would charge twice: a blind repeat of the same key is a second charge.
    pay.perform(key2, never)
    assert nodedupe.payment_stats()["charges_by_key"][key2] == 2


def test_http_lookup_found_absent_unknown(runtime: Runtime, nodedupe: Sinks, refused_port: int) -> None:
    rt = runtime
    pay = payment_adapter(nodedupe.payments_url)
    charge = pay.perform("key-found", CHARGE)
    found = pay.lookup("key-found")
    assert found.outcome == "found" and found.result is not None and found.result["id"] == charge["id"]
    assert pay.lookup("key-absent") == LookupResult.absent()
    nodedupe.payments_fail_file.touch()  # the provider's search answers 503
    unknown = pay.lookup("key-found")
    assert unknown.outcome == "unknown" and "503" in unknown.detail
    # Through the ledger an unknown answer (or a provider that cannot be reached) leaves the effect in doubt.
    tid = tasks.submit(rt.conn, "demo", {})
    key = _intent(rt, tid, "pay", "payment", CHARGE)
    with pytest.raises(EffectInDoubt, match="could not say: lookup answered 503"):
        rt.ledger.run(tid, "pay", "payment", pay, CHARGE)
    with pytest.raises(EffectInDoubt, match="lookup failed"):
        rt.ledger.run(tid, "pay", "payment", payment_adapter(f"http://127.0.0.1:{refused_port}"), CHARGE)
    rec = rt.ledger.get(key)
    assert rec is not None and (rec.state, rec.resolution) == ("intent", None)
    assert nodedupe.payment_stats()["posts"] == 1
    nodedupe.payments_fail_file.unlink()
    assert rt.ledger.run(tid, "pay", "payment", pay, CHARGE)["idempotency_key"] == key
    assert nodedupe.payment_stats()["charges_by_key"] == {"key-found": 1, key: 1}


# --- provider outages against a real agent-host --------------------------------------------------------------

def _outage_env(host_env: dict[str, str], peers: Sinks) -> dict[str, str]:
    # The outage lasts longer than the step timeout, and so do the longest waits between lookups (a host that
    # counted its backoff as a busy step would report itself stuck); the cap stays short so the test is quick.
    # The step waits more times than it may fail: waiting on a provider is not a failed attempt.
    return {**host_env, "AGENT_SMTP_URL": peers.smtp_url, "AGENT_PAYMENTS_URL": peers.payments_url,
            "AGENT_STEP_TIMEOUT_S": "1", "AGENT_EFFECT_RETRY_MAX_S": "1.5", "AGENT_STEP_MAX_ATTEMPTS": "3"}


def _pay_waits(conn: psycopg.Connection, tid: uuid.UUID) -> int:
    """Attempts of the pay step that ended waiting on the effect in doubt (they do not count as failures)."""
    row = conn.execute("SELECT count(*) FROM step_events WHERE task_id = %s AND step = 'pay' AND event = 'waiting'",
                       (tid,)).fetchone()
    return int(row[0]) if row else 0


def _wait_for(what: str, check: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _ride_out_outage(conn: psycopg.Connection, hosts: HostRunner, env: dict[str, str], tid: uuid.UUID,
                     ledger: EffectLedger, key: str, seconds: float) -> dict[str, Any]:
    """While the provider is down: the task waits (never failed or blocked), its effect stays an intent and
    /healthz stays 200, for longer than the step timeout."""
    t0 = time.monotonic()
    samples, statuses = 0, set()
    while time.monotonic() - t0 < seconds:
        code, health = hosts.get(env, "/healthz")
        assert code == 200, health
        task = tasks.get(conn, tid)
        assert task is not None and task.status in ("running", "pending"), task
        statuses.add(task.status)
        rec = ledger.get(key)
        assert rec is not None and rec.state == "intent", rec
        samples += 1
        time.sleep(0.1)
    return {"healthz_samples": samples, "statuses": sorted(statuses), "seconds": round(time.monotonic() - t0, 2)}


def test_provider_down_during_lookup_longer_than_step_timeout(tenant_db: TenantDB, host_env: dict[str, str],
                                                               hosts: HostRunner, nodedupe: Sinks) -> None:
    env = _outage_env(host_env, nodedupe)
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as conn:
        migrate(conn, tenant_db.schema)
        tid = tasks.submit(conn, "demo", {"amount": CHARGE["amount"], "payee": CHARGE["to"]})
        ledger = EffectLedger(conn, env["AGENT_TENANT_ID"])
        pay = payment_adapter(nodedupe.payments_url)
        # An earlier run of the pay step: its intent is committed and its answer was a 503 (outcome unknown)...
        nodedupe.payments_fail_file.touch()
        with pytest.raises(EffectInDoubt):
            ledger.run(tid, "pay", "payment", pay, CHARGE)
        key = ledger.key_for(tid, "pay", "payment")
        # ...but the provider had charged (this provider does not de-duplicate: a blind retry charges twice).
        nodedupe.payments_fail_file.unlink()
        charge = pay.perform(key, CHARGE)
        nodedupe.payments_fail_file.touch()  # and now it is down, for longer than the step timeout
        hosts.start(env)
        hosts.wait_ready(env)
        _wait_for("the pay step to ask the provider", lambda: _pay_waits(conn, tid) >= 1)
        seen = _ride_out_outage(conn, hosts, env, tid, ledger, key, seconds=3.0)
        asked = _pay_waits(conn, tid)
        assert asked > 3  # it kept asking by itself, more often than the step may fail, and was not blocked
        nodedupe.payments_fail_file.unlink()
        t_back = time.monotonic()
        assert wait_status(tenant_db, tid, ("done", "blocked", "failed")) == "done"
        stats = nodedupe.payment_stats()
        assert stats["charges_by_key"] == {key: 1} and stats["posts"] == 1
        rec = ledger.get(key)
        assert rec is not None and rec.resolution == "provider_lookup:found" and rec.result["id"] == charge["id"]
        assert len(nodedupe.emails()) == 1
    print(f"\nlookup outage: {seen} waits={asked} done_after_back_s={time.monotonic() - t_back:.2f}"
          f" charges={stats['charges']} posts={stats['posts']}")


def test_provider_down_during_perform(tenant_db: TenantDB, host_env: dict[str, str], hosts: HostRunner,
                                      nodedupe: Sinks) -> None:
    env = _outage_env(host_env, nodedupe)
    with connect(tenant_db.dsn, tenant_db.schema, autocommit=True) as conn:
        migrate(conn, tenant_db.schema)
        nodedupe.payments_fail_file.touch()  # down before the pay step first runs
        tid = tasks.submit(conn, "demo", {"amount": CHARGE["amount"], "payee": CHARGE["to"]})
        ledger = EffectLedger(conn, env["AGENT_TENANT_ID"])
        key = ledger.key_for(tid, "pay", "payment")
        hosts.start(env)
        hosts.wait_ready(env)
        _wait_for("the charge to be attempted and looked up", lambda: _pay_waits(conn, tid) >= 2)
        seen = _ride_out_outage(conn, hosts, env, tid, ledger, key, seconds=3.0)
        asked = _pay_waits(conn, tid)
        assert asked > 3
        nodedupe.payments_fail_file.unlink()
        assert wait_status(tenant_db, tid, ("done", "blocked", "failed")) == "done"
        stats = nodedupe.payment_stats()
        assert stats["charges_by_key"] == {key: 1} and stats["posts"] == 1
        assert ledger.get(key).resolution == "provider_lookup:absent"  # the 503 had charged nothing
    print(f"\nperform outage: {seen} waits={asked} charges={stats['charges']} posts={stats['posts']}")


# --- SmtpEffect against the aiosmtpd relay -------------------------------------------------------------------

def _mail(to: Any, subject: str, body: str = "hello") -> dict[str, Any]:
    return {"from": "agent@tenant.test", "to": to, "subject": subject, "body": body}


def test_smtp_message_id_and_refused_connection(runtime: Runtime, sinks: Sinks, refused_port: int) -> None:
    rt = runtime
    tid = tasks.submit(rt.conn, "multi", {})
    res = rt.ledger.run(tid, "greet", "email", rt.effects["email"], _mail(["a@x.test", "b@x.test"], f"hi {tid}"))
    key = rt.ledger.key_for(tid, "greet", "email")
    assert res["message_id"] == message_id_for(key) == f"<{key}@agent-runtime.invalid>"
    [mail] = sinks.emails()
    assert (mail["message_id"], mail["from"], mail["to"], mail["subject"]) == (
        res["message_id"], "agent@tenant.test", ["a@x.test", "b@x.test"], f"hi {tid}")
    # Connection refused: certainly not sent, so it is tried again later and delivered once.
    down = SmtpEffect(f"smtp://127.0.0.1:{refused_port}")
    later = _mail("c@x.test", f"later {tid}")
    with pytest.raises(EffectInDoubt, match="unreachable"):
        rt.ledger.run(tid, "later", "email", down, later)
    key2 = rt.ledger.key_for(tid, "later", "email")
    rec = rt.ledger.get(key2)
    assert rec is not None and (rec.state, rec.resolution) == ("intent", "unreached")
    assert len(sinks.emails()) == 1
    sent = rt.ledger.run(tid, "later", "email", rt.effects["email"], later)
    assert rt.ledger.run(tid, "later", "email", rt.effects["email"], later) == sent
    assert rt.ledger.get(key2).resolution == "unreached:performed"
    assert [m["message_id"] for m in sinks.emails()] == [message_id_for(key), message_id_for(key2)]


def test_smtp_dropped_after_data_blocks_for_a_human_never_sends_twice(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    tid = tasks.submit(rt.conn, "multi", {"emails": 1})
    key = rt.ledger.key_for(tid, "notify", "email")
    sinks.smtp_drop_file.touch()  # the relay takes the message, then the line drops before its 250
    assert run_task(rt, multi, tid) == "retry"
    rec = rt.ledger.get(key)
    assert rec is not None and (rec.state, rec.resolution) == ("intent", None)
    assert [m["message_id"] for m in sinks.emails()] == [message_id_for(key)]  # it was delivered
    sinks.smtp_drop_file.unlink()  # the relay is fine again: the email must still not go out twice
    assert run_task(rt, multi, tid) == "blocked"
    task = tasks.get(rt.conn, tid)
    assert task is not None and task.blocked_reason == "effect_in_doubt"
    rec = rt.ledger.get(key)
    assert rec is not None and (rec.state, rec.resolution) == ("blocked", "no_provider_lookup")
    with pytest.raises(TaskBlocked) as blocked:
        rt.ledger.run(tid, "notify", "email", rt.effects["email"], rec.args)
    assert blocked.value.reason == "effect_in_doubt"
    assert len(sinks.emails()) == 1
    # A human finds it in the relay's log and says it happened: the task goes on, nothing is sent again.
    rt.ledger.decide(key, performed=True, result={"message_id": message_id_for(key), "refused": []})
    assert tasks.get(rt.conn, tid).status == "pending"
    assert run_task(rt, multi, tid) == "done"
    assert rt.checkpoints.case_file(rt.checkpoints.latest(tid)).steps_done["notify"] == [message_id_for(key)]
    assert len(sinks.emails()) == 1


# --- WebhookEffect against a Standard Webhooks receiver -----------------------------------------------------

SECRET = "whsec_" + base64.b64encode(b"receiver-shared-secret-32-bytes!").decode()


class WebhookReceiver:
    """A receiver doing what the spec asks of one: verify the signature, act once per webhook-id.

    `fail_next` ("drop" or "500") makes the next valid delivery be acted on and then lost on the way back:
    the connection closed without an answer, or a 500 after the event was recorded.
    """

    def __init__(self, secret: str) -> None:
        self.lock = threading.Lock()
        self.deliveries: list[tuple[str, bool]] = []  # (webhook-id, signature valid)
        self.acted: dict[str, Any] = {}
        self.fail_next: str | None = None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                valid = verify_webhook(secret, dict(self.headers), body)
                msg_id = self.headers.get("webhook-id", "")
                fail = None
                with receiver.lock:
                    receiver.deliveries.append((msg_id, valid))
                    if valid:
                        receiver.acted.setdefault(msg_id, json.loads(body))  # de-duplicated by id
                        fail, receiver.fail_next = receiver.fail_next, None
                if not valid:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif fail == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                else:
                    self.send_response(500 if fail == "500" else 204)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    r = WebhookReceiver(SECRET)
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


def _webhook(url: str, secret: str) -> WebhookEffect:
    return WebhookEffect(url, credentials=InMemoryCredentialSource({"hook-secret": secret}),
                         secret_credential="hook-secret")


def test_webhook_forged_signature_is_refused(conn: psycopg.Connection, receiver: WebhookReceiver) -> None:
    ledger = EffectLedger(conn, str(uuid.uuid4()))
    tid = tasks.submit(conn, "hooks", {})
    forged = _webhook(receiver.url, "whsec_" + base64.b64encode(os.urandom(32)).decode())
    with pytest.raises(EffectFailed, match="refused with 401"):
        ledger.run(tid, "notify", "webhook", forged, {"event": "invoice.paid"})
    rec = ledger.get(ledger.key_for(tid, "notify", "webhook"))
    assert rec is not None and rec.state == "failed"
    assert [valid for _id, valid in receiver.deliveries] == [False] and receiver.acted == {}
    # What the receiver's check rests on: a changed body or a stale timestamp fails it too.
    ts = int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(ts),
               "webhook-signature": sign_webhook(SECRET, "msg_1", ts, b'{"a":1}')}
    assert verify_webhook(SECRET, headers, b'{"a":1}')
    assert not verify_webhook(SECRET, headers, b'{"a":2}')
    stale = {**headers, "webhook-timestamp": str(ts - 3600),
             "webhook-signature": sign_webhook(SECRET, "msg_1", ts - 3600, b'{"a":1}')}
    assert not verify_webhook(SECRET, stale, b'{"a":1}')


@pytest.mark.parametrize("lost", ["drop", "500"])
def test_webhook_in_doubt_is_repeated_with_the_same_id_and_acted_on_once(
        conn: psycopg.Connection, receiver: WebhookReceiver, lost: str) -> None:
    ledger = EffectLedger(conn, str(uuid.uuid4()))
    tid = tasks.submit(conn, "hooks", {})
    hook = _webhook(receiver.url, SECRET)
    key = ledger.key_for(tid, "notify", "webhook")
    receiver.fail_next = lost
    with pytest.raises(EffectInDoubt, match="outcome unknown"):
        ledger.run(tid, "notify", "webhook", hook, {"event": "invoice.paid", "invoice": 42})
    assert ledger.get(key).state == "intent" and list(receiver.acted) == [key]
    res = ledger.run(tid, "notify", "webhook", hook, {"event": "invoice.paid", "invoice": 42})
    assert res == {"webhook_id": key, "status": 204}
    rec = ledger.get(key)
    assert rec is not None and (rec.state, rec.resolution) == ("committed", "provider_replay")
    assert receiver.deliveries == [(key, True), (key, True)]  # repeated with the same id, signed both times
    assert receiver.acted == {key: {"event": "invoice.paid", "invoice": 42}}  # acted on once
    assert ledger.run(tid, "notify", "webhook", hook, {"event": "invoice.paid", "invoice": 42}) == res
    assert len(receiver.deliveries) == 2


# --- several effects of one kind, and explicit keys, through Context.effect --------------------------------

def test_two_emails_in_one_step_both_delivered(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    tid = tasks.submit(rt.conn, "multi", {"emails": 2})
    assert run_task(rt, multi, tid) == "done"
    keys = [rt.ledger.key_for(tid, "notify", "email", ordinal=i) for i in range(2)]
    assert len(set(keys)) == 2
    assert sorted(m["message_id"] for m in sinks.emails()) == sorted(message_id_for(k) for k in keys)


def test_more_effects_after_a_crash_than_before(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    grow = Agent("grow")
    runs: list[int] = []

    @grow.step
    def notify(ctx: Context) -> Any:
        runs.append(len(runs) + 1)
        sent = [ctx.effect("email", _mail(f"user{i}@x.test", f"grow {i} {ctx.task_id}"))["message_id"]
                for i in range(runs[-1])]
        if runs[-1] == 1:
            raise RuntimeError("the process stops here, after the first email")
        return sent

    tid = tasks.submit(rt.conn, "grow", {})
    assert run_task(rt, grow, tid) == "retry"
    assert len(sinks.emails()) == 1
    assert run_task(rt, grow, tid) == "done"
    subjects = [m["subject"] for m in sinks.emails()]
    assert subjects == [f"grow 0 {tid}", f"grow 1 {tid}"]  # the first replayed, the second performed once
    recs = rt.ledger.for_task(tid)
    assert [(r.ordinal, r.state, r.resolution) for r in recs] == [(0, "committed", "performed"),
                                                                 (1, "committed", "performed")]


def test_explicit_key_conflict_blocks_and_same_args_replay_across_tasks(runtime: Runtime, sinks: Sinks) -> None:
    rt = runtime
    billing = Agent("billing")

    @billing.step
    def invoice(ctx: Context) -> Any:
        return ctx.effect("email", _mail("customer@x.test", "Invoice 42", ctx.params["body"]), key="invoice-42")

    first = tasks.submit(rt.conn, "billing", {"body": "due: 10 EUR"})
    assert run_task(rt, billing, first) == "done"
    key = explicit_idempotency_key(rt.tenant_id, "email", "invoice-42")
    assert [m["message_id"] for m in sinks.emails()] == [message_id_for(key)]
    # Same key, other arguments: one key names one call, so the task is blocked and nothing is sent.
    other = tasks.submit(rt.conn, "billing", {"body": "due: 99 EUR"})
    assert run_task(rt, billing, other) == "blocked"
    task = tasks.get(rt.conn, other)
    assert task is not None and task.blocked_reason == "effect_key_conflict" and "invoice-42" in task.blocked_detail
    assert rt.ledger.for_task(other) == [] and len(sinks.emails()) == 1
    # Same key, same arguments, another task: the recorded result, not a second email.
    again = tasks.submit(rt.conn, "billing", {"body": "due: 10 EUR"})
    assert run_task(rt, billing, again) == "done"
    done = {t: rt.checkpoints.case_file(rt.checkpoints.latest(t)).steps_done["invoice"] for t in (first, again)}
    assert done[first] == done[again] and done[first]["message_id"] == message_id_for(key)
    assert len(sinks.emails()) == 1 and rt.ledger.get(key).task_id == first
