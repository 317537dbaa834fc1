"""Bootstrap commands, token hashing, and the single table of tenant lifecycle transitions."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from controlplane.errors import InvalidTransition
from tenants.actors import SYSTEM
from tenants.choices import TENANT_TRANSITIONS, TenantStatus
from tenants.lifecycle import tenant_transition
from tenants.models import AuditLog, Operator, OperatorToken, Tenant

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue()


def test_create_operator_prints_a_working_token_alone_on_the_last_line():
    token = _run("create_operator", "acme-ops", "--name", "Acme Ops").strip().splitlines()[-1]
    assert token.startswith("cpk_") and " " not in token
    stored = OperatorToken.objects.get(operator__slug="acme-ops")
    # cpk_<prefix>_<secret>: the prefix is hex, the secret URL-safe base64 (which may hold "_" itself).
    secret = token.split("_", 2)[2]
    assert token not in (stored.secret_hash, stored.prefix) and secret not in stored.secret_hash
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert client.get("/api/v1/tenants").status_code == 200
    second = _run("create_operator_token", "acme-ops").strip().splitlines()[-1]
    assert second != token and OperatorToken.objects.filter(operator__slug="acme-ops").count() == 2


def test_create_operator_refuses_duplicates_and_bad_slugs():
    _run("create_operator", "acme-ops", "--name", "Acme Ops")
    with pytest.raises(CommandError, match="already exists"):
        _run("create_operator", "acme-ops", "--name", "Again")
    with pytest.raises(CommandError, match="slug"):
        _run("create_operator", "Bad Slug!", "--name", "X")
    with pytest.raises(CommandError, match="no operator"):
        _run("create_operator_token", "missing")
    assert Operator.objects.count() == 1


def test_every_transition_outside_the_table_is_refused(operator):
    tenant = Tenant.objects.create(operator=operator, slug="t", name="T")
    statuses = list(TenantStatus.values)
    for source in statuses:
        for target in statuses:
            if source == target:
                continue
            Tenant.objects.filter(pk=tenant.pk).update(status=source)
            tenant.refresh_from_db()
            if target in TENANT_TRANSITIONS[source]:
                tenant_transition(tenant=tenant, to=target, actor=SYSTEM)
                assert Tenant.objects.get(pk=tenant.pk).status == target
            else:
                with pytest.raises(InvalidTransition):
                    tenant_transition(tenant=tenant, to=target, actor=SYSTEM)
                assert Tenant.objects.get(pk=tenant.pk).status == source
    assert AuditLog.objects.filter(action="tenant.transition", target_id=str(tenant.pk)).count() == sum(
        len(v) for v in TENANT_TRANSITIONS.values()
    )
    assert TENANT_TRANSITIONS[TenantStatus.DELETED] == frozenset()
