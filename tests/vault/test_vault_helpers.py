"""Shared helpers for the vault tests (no tests here): tenants, instances, key rings, clients."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets

from rest_framework.test import APIClient

PROBLEM = "application/problem+json"


def make_tenant(operator, slug: str | None = None, status: str = "ready"):  # type: ignore[no-untyped-def]
    from tenants.models import Tenant

    return Tenant.objects.create(operator=operator, slug=slug or f"t-{secrets.token_hex(3)}", name="Customer",
                                 status=status)


def make_instance(tenant) -> str:  # type: ignore[no-untyped-def]
    """Give ``tenant`` an instance the way provisioning does: token generated in the vault, hash at rest."""
    from provisioning.models import AgentInstance
    from tenants.actors import SYSTEM
    from vault.choices import INSTANCE_TOKEN_CREDENTIAL
    from vault.services import credential_ensure_generated

    token = credential_ensure_generated(tenant=tenant, name=INSTANCE_TOKEN_CREDENTIAL, actor=SYSTEM, nbytes=32)
    AgentInstance.objects.update_or_create(
        tenant=tenant, defaults={"status": "running", "token_hash": hashlib.sha256(token.encode()).hexdigest()}
    )
    return token


def bearer_client(token: str, **kwargs: object) -> APIClient:
    client = APIClient(**kwargs)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def ring_add_version(spec: str, version: str) -> str:
    """The key ring ``spec`` with one more (random) version appended."""
    return f"{spec},{version}:{base64.b64encode(os.urandom(32)).decode()}"


def assert_problem(resp, status: int) -> dict:  # type: ignore[no-untyped-def]
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"].startswith(PROBLEM)
    from controlplane.problem_types import has_page

    body = resp.json()
    assert body["status"] == status and body["title"] and has_page(body["type"])
    return body
