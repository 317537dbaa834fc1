"""``/api/v1/egress-rules`` held to the shared API test base (tests/api_cases.py)."""

from __future__ import annotations

from typing import Any

from egress.models import EgressRule
from egress.services import rule_create
from tenants.actors import SYSTEM
from tenants.audit import AuditAction
from tenants.choices import TokenScope
from tenants.models import Operator
from tests.api_cases import OperatorCollectionCases


class TestEgressRules(OperatorCollectionCases):
    url = "/api/v1/egress-rules"
    read_scope = TokenScope.TENANTS_READ
    write_scope = TokenScope.TENANTS_WRITE
    audit_create = AuditAction.EGRESS_RULE_CREATE
    audit_delete = AuditAction.EGRESS_RULE_DELETE
    invalid_field = "host"

    def create_data(self, operator: Operator) -> dict[str, Any]:
        return {"host": "api.openai.com", "note": "the model provider"}

    def invalid_data(self, operator: Operator) -> dict[str, Any]:
        return {"host": "*.com"}

    def make(self, operator: Operator) -> str:
        return str(rule_create(operator=operator, host="api.stripe.com", actor=SYSTEM).pk)

    def count(self, operator: Operator) -> int:
        return EgressRule.objects.filter(operator=operator).count()
