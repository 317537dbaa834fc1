"""No plaintext anywhere: database dump, logs of the test process and the workers, API responses.

Distinctive values go in through the operator API, are delivered to the instance, survive a
data-key and a KEK rotation in real workers; then every artefact is searched for them (raw,
and hex-encoded, which is how a dump would show them had they been stored in a bytea column).
"""

from __future__ import annotations

import json
import logging
import secrets
import subprocess

import pytest
from django.db import connection

from controlplane.embedded_pg import bundled_pg_bin
from tenants.actors import SYSTEM
from tests.conftest import database_url, wait_for
from tests.vault.test_vault_helpers import bearer_client, make_instance, make_tenant, ring_add_version
from vault.models import RotationJob
from vault.rotation import data_key_rotate_start, kek_rotate_start

pytestmark = pytest.mark.django_db(transaction=True)


def _needles(values: list[str]) -> list[bytes]:
    out = []
    for value in values:
        out += [value.encode(), value.encode().hex().encode(), value.encode("utf-16-le")]
    return out


def _assert_absent(haystack: bytes, needles: list[bytes], where: str) -> None:
    for needle in needles:
        assert needle not in haystack, f"a credential plaintext appears in {where}"


def test_no_plaintext_in_dump_logs_or_responses(api, worker_factory, caplog, settings):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django.db.backends")
    connection.force_debug_cursor = True  # log every SQL statement with its parameters
    tenant = make_tenant(api.operator)
    token = make_instance(tenant)
    values = [f"PLAINTEXT-{name}-{secrets.token_hex(8)}" for name in ("llm", "mail", "stripe", "otp")]
    needles = _needles(values)
    responses = []
    try:
        base = f"/api/v1/tenants/{tenant.pk}/credentials"
        for name, value in zip(("llm", "mail", "stripe", "otp"), values, strict=True):
            body = {"value": value, "one_time": name == "otp"}
            responses.append(api.put(f"{base}/{name}", data=json.dumps(body), content_type="application/json"))
            assert responses[-1].status_code == 201
        # Refused writes must not echo what they were given either.
        responses.append(api.put(f"{base}/system.x", data=json.dumps({"value": values[0]}),
                                 content_type="application/json"))
        responses.append(api.put(f"{base}/llm", data=json.dumps({"value": values[0], "one_time": "maybe"}),
                                 content_type="application/json"))
        responses.append(api.put(f"{base}/llm", data=json.dumps({"value": values[0] * 5000}),
                                 content_type="application/json"))
        assert [r.status_code for r in responses[-3:]] == [400, 400, 400]
        responses += [api.get(base), api.get(f"{base}/llm"), api.get(f"/api/v1/tenants/{tenant.pk}")]

        instance = bearer_client(token)
        delivered = [instance.get(f"/internal/v1/credentials/{n}") for n in ("llm", "mail", "stripe", "otp")]
        assert [d.json()["value"] for d in delivered] == values  # the one place a value goes out
        responses.append(instance.get("/internal/v1/credentials/otp"))  # consumed: 404
        responses.append(instance.get("/internal/v1/credentials/elsewhere"))
        responses.append(api.delete(f"{base}/stripe"))
        responses.append(instance.get("/internal/v1/credentials/stripe"))

        # Rotations in a real worker (its log is searched too).
        settings.VAULT_KEK_KEYRING = ring_add_version(settings.VAULT_KEK_KEYRING, "v2")
        worker = worker_factory()
        job = data_key_rotate_start(tenant=tenant, actor=SYSTEM)
        wait_for(lambda: RotationJob.objects.get(pk=job.pk).status == "succeeded", timeout=90)
        kek_job = kek_rotate_start(actor=SYSTEM)
        wait_for(lambda: RotationJob.objects.get(pk=kek_job.pk).status == "succeeded", timeout=90)
        after = instance.get("/internal/v1/credentials/llm")
        assert after.json()["value"] == values[0]
    finally:
        connection.force_debug_cursor = False

    for i, resp in enumerate(responses):
        _assert_absent(resp.content, needles, f"API response #{i} ({resp.status_code})")
    _assert_absent(caplog.text.encode(), needles, "the test process's logs")
    assert "INSERT INTO" in caplog.text  # the SQL log really was captured
    worker.stop()
    worker_log = worker.log()
    assert "controlplane.jobs.tasks.job_drive_task" in worker_log and "succeeded" in worker_log
    _assert_absent(worker_log.encode(), needles, "the worker log")

    dump = subprocess.run([str(bundled_pg_bin("pg_dump")), "--data-only", "--dbname", database_url()],
                          capture_output=True, timeout=120, check=True).stdout
    assert b"vault_credentialversion" in dump and tenant.slug.encode() in dump
    _assert_absent(dump, needles, "the database dump")
