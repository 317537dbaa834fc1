"""`controlplane.db.rows`: a model read by one parameterised statement is the model the ORM would have built."""

from __future__ import annotations

import pytest

from tenants.actors import SYSTEM
from tenants.models import Tenant
from tenants.services import operator_create
from tenants.tokens import operator_token_issue, operator_token_verify_for_tenant


@pytest.mark.django_db
def test_a_tenant_read_with_its_token_has_its_json_and_arrays_as_the_orm_gives_them() -> None:
    """Django's cursor sends a JSON column as text: the row's values go through the fields' converters."""
    operator = operator_create(slug="rows-op", name="Rows", actor=SYSTEM)
    tenant = Tenant.objects.create(operator=operator, slug="rows-t", name="Customer", metadata={"crm": "42"})
    issued = operator_token_issue(operator=operator, actor=SYSTEM)
    token, got = operator_token_verify_for_tenant(issued.plaintext, tenant.pk)
    assert token is not None and got is not None
    expected = Tenant.objects.get(pk=tenant.pk)
    assert got.metadata == expected.metadata == {"crm": "42"}
    assert [getattr(got, f.attname) for f in Tenant._meta.concrete_fields] == [
        getattr(expected, f.attname) for f in Tenant._meta.concrete_fields]
    assert token.scopes == operator_token_issue(operator=operator, actor=SYSTEM, name="again").token.scopes
