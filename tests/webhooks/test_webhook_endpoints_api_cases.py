"""``/api/v1/webhook-endpoints`` held to the shared API test base (tests/api_cases.py)."""

from __future__ import annotations

from typing import Any

from tenants.actors import SYSTEM
from tenants.audit import AuditAction
from tenants.choices import TokenScope
from tenants.models import Operator
from tests.api_cases import OperatorCollectionCases
from webhooks.models import WebhookEndpoint
from webhooks.services import endpoint_create


class TestWebhookEndpoints(OperatorCollectionCases):
    url = "/api/v1/webhook-endpoints"
    read_scope = TokenScope.WEBHOOKS_READ
    write_scope = TokenScope.WEBHOOKS_WRITE
    audit_create = AuditAction.WEBHOOK_ENDPOINT_CREATE
    audit_delete = AuditAction.WEBHOOK_ENDPOINT_DELETE
    update_data = {"description": "billing", "event_types": ["tenant.*"]}
    invalid_field = "url"

    def create_data(self, operator: Operator) -> dict[str, Any]:
        return {"url": "https://93.184.216.34/hook", "event_types": ["tenant.*"]}

    def invalid_data(self, operator: Operator) -> dict[str, Any]:
        return {"url": "https://127.0.0.1/hook"}

    def make(self, operator: Operator) -> str:
        return str(endpoint_create(operator=operator, url="https://93.184.216.34/made", actor=SYSTEM).endpoint.pk)

    def count(self, operator: Operator) -> int:
        return WebhookEndpoint.objects.filter(operator=operator).count()
