"""Vault benchmark on real PostgreSQL: crypto overhead against raw AESGCM, and delivery latency.

1. Encrypt+decrypt round trip of one credential value through the vault's code path with a
   cached data key (cache lookup of the unwrapped key, associated data built from tenant/name/
   version, fresh nonce, seal, open), against raw ``AESGCM`` encrypt+decrypt of the same bytes
   with the same associated data, measured interleaved in the same run. Goal: under 3x.
2. p50/p95 of one credential fetch by an instance over ``GET /internal/v1/credentials/{name}``
   (Django test client, full stack: instance-token check, row lock, decrypt, audit row, commit).
3. For context: ``credential_put`` through the API and a data-key rotation's re-encryption rate.

The instance (600/min) and operator (300/min) credential throttles are raised for the run: the bench fetches a
thousand times a minute from one instance on purpose, and the throttle's own check stays on the timed path.
``BENCH_VAULT_CRYPTO_N`` (20,000), ``BENCH_VAULT_FETCH_N`` (500), ``BENCH_VAULT_PUT_N`` (200),
``BENCH_VAULT_ROTATE_N`` (500).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import django  # noqa: E402

from bench import _run, _setup  # noqa: E402  (environment first)

os.environ["THROTTLE_INSTANCE_CREDENTIALS_RATE"] = "1000000/min"
os.environ["THROTTLE_CREDENTIALS_RATE"] = "1000000/min"
django.setup()

from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402
from django.core.management import call_command  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from provisioning.models import AgentInstance  # noqa: E402
from tenants.actors import SYSTEM  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import operator_create  # noqa: E402
from tenants.tokens import operator_token_issue  # noqa: E402
from vault.choices import INSTANCE_TOKEN_CREDENTIAL, KeyPurpose  # noqa: E402
from vault.envelope import credential_aad, open_sealed, seal  # noqa: E402
from vault.models import TenantDataKey  # noqa: E402
from vault.rotation import data_key_rotate_start, rotation_job_execute  # noqa: E402
from vault.services import _unwrap, credential_ensure_generated, credential_put  # noqa: E402

console = Console(width=150)
N_CRYPTO = _run.size("BENCH_VAULT_CRYPTO_N", 20000, smoke=2000)
N_FETCH = _run.size("BENCH_VAULT_FETCH_N", 500, smoke=10)
N_PUT = _run.size("BENCH_VAULT_PUT_N", 200, smoke=10)
N_ROTATE = _run.size("BENCH_VAULT_ROTATE_N", 500, smoke=10)
BLOCK = min(1000, max(1, N_CRYPTO // 10))  # round trips per block; the blocks alternate vault / raw
VALUE = ("sk-" + "x" * 61).encode()  # a typical 64-byte API key


def crypto_round_trips(tenant: Tenant) -> tuple[float, float]:
    """Mean seconds per round trip: (vault path, raw AESGCM), in alternating blocks (who goes first alternating
    too) to share noise."""
    key_row = TenantDataKey.objects.get(tenant=tenant, purpose=KeyPurpose.CREDENTIALS)
    raw_key = _unwrap(key_row)
    tenant_id = str(tenant.pk)
    raw_aad = credential_aad(tenant_id, "llm-key", 1)
    aes = AESGCM(raw_key)

    def vault_once() -> None:
        key = _unwrap(key_row)  # cache hit
        aad = credential_aad(tenant_id, "llm-key", 1)
        assert open_sealed(key, seal(key, VALUE, aad), aad) == VALUE

    def raw_once() -> None:
        nonce = os.urandom(12)
        assert aes.decrypt(nonce, aes.encrypt(nonce, VALUE, raw_aad), raw_aad) == VALUE

    spent = {vault_once: 0.0, raw_once: 0.0}
    for i in range(N_CRYPTO // BLOCK):
        for once in ((vault_once, raw_once) if i % 2 == 0 else (raw_once, vault_once)):
            start = time.perf_counter()
            for _ in range(BLOCK):
                once()
            spent[once] += time.perf_counter() - start
    n = (N_CRYPTO // BLOCK) * BLOCK
    return spent[vault_once] / n, spent[raw_once] / n


def fetch_latencies(tenant: Tenant, token: str) -> list[float]:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    samples = []
    warmup = min(20, N_FETCH)
    for i in range(N_FETCH + warmup):
        start = time.perf_counter()
        resp = client.get("/internal/v1/credentials/llm-key")
        elapsed = time.perf_counter() - start
        assert resp.status_code == 200 and json.loads(resp.content)["version"] == 1, (resp.status_code,
                                                                                     resp.content[:300])
        if i >= warmup:  # warm-up: connection, caches
            samples.append(elapsed)
    return samples


def put_latencies(tenant: Tenant, operator_token: str) -> list[float]:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {operator_token}")
    samples = []
    for i in range(N_PUT):
        body = json.dumps({"value": f"value-{i}"})
        start = time.perf_counter()
        resp = client.put(f"/api/v1/tenants/{tenant.pk}/credentials/put-{i % 20}", data=body,
                          content_type="application/json")
        samples.append(time.perf_counter() - start)
        assert resp.status_code in (200, 201), (resp.status_code, resp.content[:300])
    return samples


def rotation_rate(operator) -> float:  # type: ignore[no-untyped-def]
    tenant = Tenant.objects.create(operator=operator, slug="rotate", name="Rotate", status="ready")
    for i in range(N_ROTATE):
        credential_put(tenant=tenant, name=f"cred-{i}", value=f"value-{i}", actor=SYSTEM)
    job = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
    start = time.perf_counter()
    assert rotation_job_execute(str(job.pk)) == "succeeded"
    return N_ROTATE / (time.perf_counter() - start)


def main() -> None:
    call_command("migrate", verbosity=0)
    operator = operator_create(slug="bench-vault", name="Bench", actor=SYSTEM)
    operator_token = operator_token_issue(operator=operator, actor=SYSTEM).plaintext
    tenant = Tenant.objects.create(operator=operator, slug="bench", name="Bench", status="ready")
    token = credential_ensure_generated(tenant=tenant, name=INSTANCE_TOKEN_CREDENTIAL, actor=SYSTEM, nbytes=32)
    AgentInstance.objects.create(tenant=tenant, status="running", token_hash=hashlib.sha256(token.encode()).hexdigest())
    credential_put(tenant=tenant, name="llm-key", value=VALUE.decode(), actor=SYSTEM)

    vault_s, raw_s = crypto_round_trips(tenant)
    fetch = fetch_latencies(tenant, token)  # CONN_MAX_AGE=0 (the default): a new connection per request
    from django.db import connection

    connection.settings_dict["CONN_MAX_AGE"] = 60
    fetch_persistent = fetch_latencies(tenant, token)
    connection.settings_dict["CONN_MAX_AGE"] = 0
    put = put_latencies(tenant, operator_token)
    rate = rotation_rate(operator)
    fetch_p50, fetch_p95 = _setup.percentiles(fetch)
    pfetch_p50, pfetch_p95 = _setup.percentiles(fetch_persistent)
    put_p50, put_p95 = _setup.percentiles(put)
    ratio = vault_s / raw_s

    console.print(f"PostgreSQL: {_setup.SERVER_URL.rsplit('@', 1)[-1]}  database {_setup.DB_NAME}")
    table = Table(title="Credential vault")
    for col in ("measure", "n", "ours", "anchor", "ratio / goal"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    table.add_row("encrypt+decrypt round trip, cached data key (µs)", str(N_CRYPTO),
                  f"{vault_s * 1e6:.2f}", f"raw AESGCM {raw_s * 1e6:.2f}",
                  f"{ratio:.2f}x (goal < 3x) {'OK' if ratio < 3 else 'MISSED'}")
    table.add_row("instance fetch GET /internal/v1/credentials/{name} p50 / p95 (ms)", str(N_FETCH),
                  f"{fetch_p50:.2f} / {fetch_p95:.2f}", "-", "-")
    table.add_row("  same, persistent DB connection (CONN_MAX_AGE=60)", str(N_FETCH),
                  f"{pfetch_p50:.2f} / {pfetch_p95:.2f}", "-", "-")
    table.add_row("operator PUT credential p50 / p95 (ms)", str(N_PUT), f"{put_p50:.2f} / {put_p95:.2f}", "-", "-")
    table.add_row("data-key rotation, re-encrypt (credentials/s)", str(N_ROTATE), f"{rate:.0f}", "-", "-")
    console.print(table)
    console.print(f"fetch mean {statistics.mean(fetch) * 1000:.2f} ms; each fetch writes one audit row")
    _run.ratio_line("vault", "encrypt+decrypt, vault path / raw AESGCM", ratio,
                    f"(raw {raw_s * 1e6:.2f} µs; goal < 3x)")


if __name__ == "__main__":
    main()
