"""Operator API tokens: issue (shown once), verify, revoke. Only a SHA-256 of the secret is stored.

Tokens are 256-bit random values, so a fast hash is enough (no password stretching needed);
the lookup prefix lets us find the row without scanning, and the compare is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from controlplane.errors import NotFound, ValidationFailed

from .actors import Actor
from .audit import audit_record
from .audit_actions import AuditAction
from .choices import ALL_TOKEN_SCOPES
from .models import Operator, OperatorToken

__all__ = ["IssuedToken", "operator_token_issue", "operator_token_revoke", "operator_token_verify",
           "token_secret_hash"]

TOKEN_PREFIX = "cpk"


@dataclass(frozen=True)
class IssuedToken:
    token: OperatorToken
    plaintext: str  # shown to the caller once, never stored


def token_secret_hash(secret: str) -> str:
    """What is stored of a token's secret (operator and customer tokens alike)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def operator_token_issue(
    *, operator: Operator, actor: Actor, name: str = "default", scopes: list[str] | None = None
) -> IssuedToken:
    scopes = list(scopes) if scopes is not None else list(ALL_TOKEN_SCOPES)
    unknown = sorted(set(scopes) - set(ALL_TOKEN_SCOPES))
    if unknown:
        raise ValidationFailed(f"unknown token scopes: {', '.join(unknown)}")
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        token = OperatorToken.objects.create(
            operator=operator, name=name, prefix=prefix, secret_hash=token_secret_hash(secret), scopes=scopes
        )
        audit_record(
            actor=actor, action=AuditAction.OPERATOR_TOKEN_ISSUE, target=token, operator=operator,
            data={"prefix": prefix, "scopes": scopes},
        )
    return IssuedToken(token=token, plaintext=f"{TOKEN_PREFIX}_{prefix}_{secret}")


def operator_token_verify(raw: str) -> OperatorToken | None:
    """Return the live token for ``raw`` or None. Never says which part was wrong."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    token = OperatorToken.objects.select_related("operator").filter(prefix=parts[1]).first()
    if token is None or token.revoked_at is not None:
        return None
    if not hmac.compare_digest(token.secret_hash, token_secret_hash(parts[2])):
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        OperatorToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


def operator_token_revoke(*, operator: Operator, prefix: str, actor: Actor) -> OperatorToken:
    with transaction.atomic():
        token = OperatorToken.objects.select_for_update().filter(operator=operator, prefix=prefix).first()
        if token is None:
            raise NotFound("token not found")
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            audit_record(actor=actor, action=AuditAction.OPERATOR_TOKEN_REVOKE, target=token, operator=operator)
    return token
