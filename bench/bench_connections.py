"""Connected-accounts benchmark on real PostgreSQL: a token fetch from inside an instance against a plain vault
credential fetch, measured interleaved in the same run (issue 33's goal: at most 1.2x).

Both go through the full stack with the same instance token (Django test client: instance-token check, throttle,
vault read and decrypt, commit): ``GET /internal/v1/connections/{provider}`` (the tenant's release declarations,
the newest active connection, the refresh decision -- the token is an hour from expiry, so no provider is asked,
which is the steady state the refresh sweep keeps -- the tokens read from the vault, the coalesced delivery
audit) against ``GET /internal/v1/credentials/{name}`` (its own audit row per fetch). Blocks alternate between
the two, who goes first alternating too, so they share the machine's noise. ``BENCH_CONNECTIONS_N`` (400).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import django  # noqa: E402

from bench import _run, _setup  # noqa: E402  (environment first)

os.environ["THROTTLE_INSTANCE_CREDENTIALS_RATE"] = "1000000/min"
django.setup()

from django.core.management import call_command  # noqa: E402
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


if __name__ == "__main__":
    main()
