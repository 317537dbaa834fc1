"""Connected-accounts benchmark on real PostgreSQL: a token fetch from inside an instance against a plain vault
credential fetch, measured interleaved in the same run (issue 33's goal: at most 1.2x).

Both go through the full stack with the same instance token (Django test client: instance-token check, throttle,
vault read and decrypt, commit): ``GET /internal/v1/connections/{provider}`` (the tenant's release declarations,
the newest active connection, the refresh decision -- the token is an hour from expiry, so no provider is asked,
which is the steady state the refresh sweep keeps -- the tokens read from the vault, the coalesced delivery
audit) against ``GET /internal/v1/credentials/{name}`` (its own audit row per fetch). Blocks alternate between
the two, who goes first alternating too, so they share the machine's noise. ``BENCH_CONNECTIONS_N`` (400).

Refresh throughput: ``BENCH_CONNECTIONS_REFRESH_N`` (10,000) connections whose access tokens expire spread over
the next hour, each with a real refresh token at the Authlib authorization server of tests/oauth_peer.py (rotation
and reuse detection on); one process runs the refresh sweep (``connections_refresh_due``, what one worker's beat
job runs) until every one is refreshed, soonest expiry first. Reported: refreshes per second, whether each was
refreshed before its old token expired (the goal), and, as the anchor, the provider's own rate measured in the
same run (refresh requests sent straight to its token endpoint, no control plane). The provider runs in this same
process (a thread): it takes its share of the one core, so the rates are pessimistic for both.

``--soak`` (``make bench`` runs it after the others): issue 33's soak, a real instance using its connection for
``CONN_SOAK_S`` (600) seconds of ``CONN_SOAK_LIFETIME_S`` (30) second access tokens while SIGKILLed
``CONN_SOAK_KILLS`` (10) times at random (tests/connections/test_connections_soak.py at those numbers), then the
refresher SIGKILLed mid-refresh ``CONN_CHAOS_ROUNDS`` (20) times (tests/connections/test_connections_chaos.py).
Pytest, against ``DATABASE_URL`` or this machine's server.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def soak() -> int:
    """The issue's long runs: tests/connections/test_connections_soak.py at its numbers and
    tests/connections/test_connections_chaos.py at
    20 kills (the suite runs 6: 20 take minutes), overridable through the same env."""
    env = {"CONN_SOAK_S": "600", "CONN_SOAK_LIFETIME_S": "30", "CONN_SOAK_KILLS": "10", "CONN_CHAOS_ROUNDS": "20",
           **os.environ}
    env.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/cp_bench_soak")
    print(f"soak: {env['CONN_SOAK_S']} s of {env['CONN_SOAK_LIFETIME_S']} s access tokens, "
          f"{env['CONN_SOAK_KILLS']} SIGKILLs of the agent-host; then the refresher SIGKILLed "
          f"{env['CONN_CHAOS_ROUNDS']} times mid-refresh", flush=True)
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--timeout",
                            str(int(float(env["CONN_SOAK_S"])) + 1800), "tests/connections/test_connections_soak.py",
                            "tests/connections/test_connections_chaos.py"], cwd=ROOT, env=env)


if __name__ == "__main__" and "--soak" in sys.argv[1:]:
    raise SystemExit(soak())

sys.path.insert(0, str(ROOT))
os.environ.setdefault("OAUTH_ALLOW_HTTP_LOOPBACK", "1")  # the refresh part's provider: http on 127.0.0.1
os.environ.setdefault("OAUTH_ALLOW_PRIVATE_ADDRESSES", "1")
import django  # noqa: E402

from bench import _run, _setup  # noqa: E402  (environment first)

os.environ["THROTTLE_INSTANCE_CREDENTIALS_RATE"] = "1000000/min"
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db.models import F  # noqa: E402
from django.utils import timezone  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from connections.choices import connection_credential_name  # noqa: E402
from connections.models import Connection, OAuthClient  # noqa: E402
from provisioning.models import AgentInstance  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create  # noqa: E402
from vault.choices import INSTANCE_TOKEN_CREDENTIAL  # noqa: E402
from vault.services import credential_ensure_generated, credential_put  # noqa: E402

console = Console(width=150)
N = _run.size("BENCH_CONNECTIONS_N", 400, smoke=20)
REFRESH_N = _run.size("BENCH_CONNECTIONS_REFRESH_N", 10_000, smoke=100)
ANCHOR_N = min(REFRESH_N, 500)
BLOCK = max(1, min(20, N // 10))
TOKENS = json.dumps({"access_token": "ya29." + "a" * 160, "refresh_token": "1//" + "r" * 100})


def setup() -> str:
    """A customer with an instance token, a plain credential and an active connection whose tokens (same size
    class as Google's) sit in its vault; the connection is an hour from expiry, so no provider is asked."""
    operator = operator_create(slug=f"bench-conn-{os.getpid()}", name="Bench", actor=SYSTEM)
    tenant = Tenant.objects.create(operator=operator, slug="bench-conn", name="Bench", status="ready")
    token = credential_ensure_generated(tenant=tenant, name=INSTANCE_TOKEN_CREDENTIAL, actor=SYSTEM, nbytes=32)
    AgentInstance.objects.create(tenant=tenant, status="running", token_hash=hashlib.sha256(token.encode()).hexdigest())
    credential_put(tenant=tenant, name="llm-key", value=TOKENS, actor=SYSTEM)
    client = OAuthClient.objects.create(
        operator=operator,
        provider="google",
        client_id="bench",
        authorization_endpoint="https://accounts.example.com/o/oauth2/auth",
        token_endpoint="https://oauth2.example.com/token",
    )
    connection = Connection.objects.create(
        tenant=tenant,
        oauth_client=client,
        provider="google",
        account_id="bench-user",
        scopes=["openid", "email"],
        expires_at=timezone.now() + timedelta(hours=1),
    )
    credential_put(tenant=tenant, name=connection_credential_name(connection.pk), value=TOKENS, actor=SYSTEM)
    return token


def interleaved(token: str) -> tuple[list[float], list[float]]:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def connection_once() -> None:
        resp = client.get("/internal/v1/connections/google")
        assert resp.status_code == 200 and resp.json()["access_token"].startswith("ya29."), resp.content[:300]

    def credential_once() -> None:
        resp = client.get("/internal/v1/credentials/llm-key")
        assert resp.status_code == 200, resp.content[:300]

    samples: dict[object, list[float]] = {connection_once: [], credential_once: []}
    for _ in range(min(20, N)):  # warm-up: connections, caches
        connection_once()
        credential_once()
    for i in range(max(1, N // BLOCK)):
        for once in (connection_once, credential_once) if i % 2 == 0 else (credential_once, connection_once):
            for _ in range(BLOCK):
                start = time.perf_counter()
                once()
                samples[once].append(time.perf_counter() - start)
    return samples[connection_once], samples[credential_once]


def refresh_setup(peer) -> tuple[dict[object, object], Tenant]:  # type: ignore[no-untyped-def]
    """REFRESH_N active connections of one customer's end users at ``peer``, expiring spread over the next hour
    (soonest in a minute), each with its own refresh-token family at the provider and its tokens in the customer's
    vault.
    Returns each connection's expiry before the run."""
    from connections.services import oauth_client_create
    from tests.oauth_peer import _RefreshToken

    operator = operator_create(slug=f"bench-refresh-{os.getpid()}", name="Bench refresh", actor=SYSTEM)
    tenant = Tenant.objects.create(operator=operator, slug="bench-refresh", name="Bench refresh", status="ready")
    client = oauth_client_create(operator=operator, actor=SYSTEM, provider="acme", client_id=peer.client.client_id,
                                 client_secret=peer.client.client_secret, issuer=peer.issuer, scopes=["email"])
    now = timezone.now()
    rows = Connection.objects.bulk_create([
        # One end user each: a customer has one active connection per provider and end user.
        Connection(tenant=tenant, oauth_client=client, provider="acme", account_id=f"user-{i}", end_user=f"user-{i}",
                   scopes=["email"], expires_at=now + timedelta(seconds=60 + 3540 * i / REFRESH_N))
        for i in range(REFRESH_N)])
    for row in rows:
        refresh = secrets.token_urlsafe(32)
        peer.refresh_tokens[refresh] = _RefreshToken(token=refresh, client_id=peer.client.client_id, scope="email",
                                                     user="alice@example.com", family=secrets.token_hex(8))
        credential_put(tenant=tenant, name=connection_credential_name(row.pk), actor=SYSTEM,
                       value=json.dumps({"access_token": secrets.token_urlsafe(32), "refresh_token": refresh}))
    return {row.pk: row.expires_at for row in rows}, tenant


def provider_rate(peer) -> float:  # type: ignore[no-untyped-def]
    """The anchor: refresh requests sent straight to the provider's token endpoint (one connection-pooled client,
    one after another, as the sweep sends them), each token its own family."""
    import httpx

    from tests.oauth_peer import _RefreshToken

    tokens = []
    for _ in range(ANCHOR_N):
        refresh = secrets.token_urlsafe(32)
        peer.refresh_tokens[refresh] = _RefreshToken(token=refresh, client_id=peer.client.client_id, scope="email",
                                                     user="alice@example.com", family=secrets.token_hex(8))
        tokens.append(refresh)
    basic = base64.b64encode(f"{peer.client.client_id}:{peer.client.client_secret}".encode()).decode()
    with httpx.Client(headers={"Authorization": f"Basic {basic}"}, timeout=30) as http:
        start = time.perf_counter()
        for refresh in tokens:
            answer = http.post(f"{peer.issuer}/token", data={"grant_type": "refresh_token", "refresh_token": refresh})
            assert answer.status_code == 200, answer.text[:200]
        return ANCHOR_N / (time.perf_counter() - start)


def refresh_run() -> dict[str, float]:
    import logging

    from connections.services import connections_refresh_due
    from tests.oauth_peer import OAuthPeer

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    with OAuthPeer(access_token_lifetime_s=3600, scope="email") as peer:
        # The fetch part's connection (an unreachable provider, an hour from expiry) is not this run's.
        Connection.objects.exclude(provider="acme").update(status="revoked")
        expiry_before, tenant = refresh_setup(peer)
        anchor = provider_rate(peer)
        # Setting up 10,000 vault credentials takes minutes: the hour of expiries starts now, not before it.
        shift = timezone.now() + timedelta(seconds=60) - min(expiry_before.values())  # type: ignore[operator]
        Connection.objects.filter(tenant=tenant).update(expires_at=F("expires_at") + shift)
        expiry_before = dict(Connection.objects.filter(tenant=tenant).values_list("pk", "expires_at"))
        presented_before = len(peer.refresh_presented)
        start = time.perf_counter()
        counts: dict[str, int] = {}
        for _ in range(REFRESH_N // 1000 + 5):  # the sweep, run back to back (one worker, one process)
            done = connections_refresh_due(window_s=3600, limit=1000)
            if not done or counts.get("refreshed", 0) >= REFRESH_N:
                break
            for outcome, n in done.items():
                counts[outcome] = counts.get(outcome, 0) + n
        took = time.perf_counter() - start
        late = sum(1 for pk, at in Connection.objects.filter(tenant=tenant).values_list("pk", "last_refreshed_at")
                   if at is None or at >= expiry_before[pk])
        presented = peer.refresh_presented[presented_before:]
        assert len(presented) == len(set(presented)) and peer.reuse_detected == [], "a refresh token was replayed"
    rate = counts.get("refreshed", 0) / took
    table = Table(title=f"Connected accounts: refreshing {REFRESH_N:,} connections expiring within the hour, one "
                        f"process")
    for col in ("measure", "n", "seconds", "per second"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    table.add_row("control plane: refresh sweep (lock, marker, provider, vault, commit)",
                  str(counts.get("refreshed", 0)), f"{took:.1f}", f"{rate:.1f}")
    table.add_row("anchor: the provider's token endpoint alone", str(ANCHOR_N), f"{ANCHOR_N / anchor:.1f}",
                  f"{anchor:.1f}")
    console.print(table)
    needed = REFRESH_N / 3600
    console.print(f"outcomes {counts}; refreshed after their old token expired: {late}; needed on average "
                  f"{needed:.2f}/s, sustained {rate:.1f}/s ({rate / needed:.0f}x headroom)")
    _run.ratio_line("connections", "refreshes per second, control plane / provider alone", rate / anchor,
                    f"({rate:.1f}/s for {REFRESH_N:,} connections in {took:.0f} s; {late} late; goal: all "
                    f"refreshed before expiry on one worker {'OK' if late == 0 else 'MISSED'})")
    return {"refresh_n": REFRESH_N, "refresh_s": took, "refresh_per_s": rate, "provider_per_s": anchor, "late": late}


def main() -> None:
    call_command("migrate", verbosity=0)
    token = setup()
    conn_s, cred_s = interleaved(token)
    c50, c95 = _setup.percentiles(conn_s)
    v50, v95 = _setup.percentiles(cred_s)
    ratio50, ratio95 = c50 / v50, c95 / v95
    console.print(f"PostgreSQL: {_setup.SERVER_URL.rsplit('@', 1)[-1]}  database {_setup.DB_NAME}")
    table = Table(title="Connected accounts: token fetch from inside an instance")
    for col in ("measure", "n", "p50 (ms)", "p95 (ms)"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    table.add_row("GET /internal/v1/connections/google (no refresh due)", str(len(conn_s)), f"{c50:.2f}", f"{c95:.2f}")
    table.add_row("anchor: GET /internal/v1/credentials/llm-key", str(len(cred_s)), f"{v50:.2f}", f"{v95:.2f}")
    table.add_row("ratio", "", f"{ratio50:.2f}x", f"{ratio95:.2f}x")
    console.print(table)
    _run.ratio_line(
        "connections",
        "token fetch p50, connection / plain credential",
        ratio50,
        f"(credential p50 {v50:.2f} ms, p95 ratio {ratio95:.2f}x; goal <= 1.2x {'OK' if ratio50 <= 1.2 else 'MISSED'})",
    )
    refreshed = refresh_run()
    _run.write_json("connections", {"fetch_p50_ms": c50, "fetch_p95_ms": c95, "credential_p50_ms": v50,
                                    "credential_p95_ms": v95, **refreshed})


if __name__ == "__main__":
    main()
