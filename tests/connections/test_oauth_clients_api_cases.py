"""``/api/v1/oauth-clients`` held to the shared API test base (tests/api_cases.py). Clients are not deleted through
the API (their connections hold tokens issued to them), so the base leaves its delete test out."""

from __future__ import annotations

from typing import Any

from connections.models import OAuthClient
from connections.services import oauth_client_create
from tenants.actors import SYSTEM
from tenants.audit import AuditAction
from tenants.choices import TokenScope
from tenants.models import Operator
from tests.api_cases import OperatorCollectionCases

ENDPOINTS = {"authorization_endpoint": "https://auth.example/authorize", "token_endpoint": "https://auth.example/token"}


class TestOAuthClients(OperatorCollectionCases):
    url = "/api/v1/oauth-clients"
    read_scope = TokenScope.TENANTS_READ
    write_scope = TokenScope.CREDENTIALS_WRITE
    audit_create = AuditAction.OAUTH_CLIENT_CREATE
    can_delete = False
    invalid_field = "token_endpoint"

    def create_data(self, operator: Operator) -> dict[str, Any]:
        return {"provider": "acme", "client_id": "cid", "client_secret": "s3cret", **ENDPOINTS}

    def invalid_data(self, operator: Operator) -> dict[str, Any]:
        return {"provider": "acme", "client_id": "cid", **ENDPOINTS, "token_endpoint": "not a url"}

    def make(self, operator: Operator) -> str:
        return str(oauth_client_create(operator=operator, actor=SYSTEM, provider="made", client_id="c",
                                       **ENDPOINTS).pk)

    def count(self, operator: Operator) -> int:
        return OAuthClient.objects.filter(operator=operator).count()
