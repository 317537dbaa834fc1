"""Customer tokens (``ctk_<prefix>_<secret>``): short-lived, one tenant, a few scopes. Issue, verify, revoke.

Like Stripe's ephemeral keys: the operator's back end mints one for the customer its front end serves,
and that front end talks to the control plane directly. Only a SHA-256 of the secret is stored (the
secret is 256 random bits); the lookup prefix finds the row, the compare is constant-time.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.errors import NotFound, ValidationFailed
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TENANT_GONE, ActorKind
from tenants.end_users import validate_end_user
from tenants.models import OperatorToken, Tenant
from tenants.tokens import token_secret_hash

from .choices import (
    CUSTOMER_TOKEN_PREFIX,
    CUSTOMER_TOKEN_SCOPES,
    CUSTOMER_TOKEN_TTL_DEFAULT_S,
    CUSTOMER_TOKEN_TTL_MAX_S,
    CUSTOMER_TOKEN_TTL_MIN_S,
)
from .models import CustomerToken

__all__ = ["IssuedCustomerToken", "Verified", "customer_token_issue", "customer_token_verify",
           "customer_token_end_user",
           "customer_token_revoke", "customer_token_actor", "customer_token_refused", "looks_like_customer_token"]


@dataclass(frozen=True)
class IssuedCustomerToken:
    token: CustomerToken
    plaintext: str  # shown to the caller once, never stored


@dataclass(frozen=True)
class Verified:
    """The outcome of a verification: the token row when its prefix exists, and whether it is usable."""

    token: CustomerToken | None
    state: str  # "ok", "expired", "revoked", "invalid"

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def looks_like_customer_token(raw: str) -> bool:
    return raw.startswith(CUSTOMER_TOKEN_PREFIX + "_")


def customer_token_actor(token: CustomerToken) -> Actor:
    return Actor(kind=ActorKind.TOKEN, id=str(token.pk),
                 label=f"customer token {token.prefix} of {token.tenant.slug}"[:200],
                 operator_id=str(token.operator_id))


def customer_token_issue(*, tenant: Tenant, scopes: list[str], actor: Actor, ttl_s: int | None = None,
                         created_by: OperatorToken | None = None, end_user: str | None = None) -> IssuedCustomerToken:
    """Mint a token for ``tenant``. ``created_by``'s own scopes bound what it can delegate. ``end_user``: the one end
    user of the tenant the front end holding it serves (``customer_token_end_user``)."""
    end_user = validate_end_user(end_user)
    if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) for s in scopes):
        raise ValidationFailed("scopes must be a non-empty list")
    unknown = sorted(set(scopes) - set(CUSTOMER_TOKEN_SCOPES))
    if unknown:
        raise ValidationFailed(f"scopes not available to customer tokens: {', '.join(unknown)} "
                               f"(available: {', '.join(CUSTOMER_TOKEN_SCOPES)})")
    if created_by is not None:
        missing = sorted(set(scopes) - set(created_by.scopes))
        if missing:
            raise ValidationFailed(f"this operator token cannot delegate scopes it lacks: {', '.join(missing)}")
    ttl = CUSTOMER_TOKEN_TTL_DEFAULT_S if ttl_s is None else ttl_s
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not (
            CUSTOMER_TOKEN_TTL_MIN_S <= ttl <= CUSTOMER_TOKEN_TTL_MAX_S):
        raise ValidationFailed(f"ttl_s must be {CUSTOMER_TOKEN_TTL_MIN_S}-{CUSTOMER_TOKEN_TTL_MAX_S} seconds")
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    scopes = sorted(set(scopes))
    with transaction.atomic():
        token = CustomerToken.objects.create(
            tenant=tenant, operator_id=tenant.operator_id, prefix=prefix, secret_hash=token_secret_hash(secret),
            scopes=scopes, end_user=end_user,
            expires_at=timezone.now() + timedelta(seconds=ttl), created_by=created_by)
        audit_record(actor=actor, action=AuditAction.CUSTOMER_TOKEN_ISSUE, target=token, tenant=tenant,
                     data={"prefix": prefix, "scopes": scopes, "ttl_s": ttl, "end_user": end_user})
    return IssuedCustomerToken(token=token, plaintext=f"{CUSTOMER_TOKEN_PREFIX}_{prefix}_{secret}")


def customer_token_end_user(token: CustomerToken | None, named: object) -> str | None:
    """The end user a request acts for: the one its customer token is bound to (naming another is refused: a
    token handed to one person's browser cannot act for someone else), else the one the request names (an
    operator token, or a customer token of the tenant as a whole), else None."""
    named = validate_end_user(named)
    if token is None or token.end_user is None:
        return named
    if named is not None and named != token.end_user:
        raise ValidationFailed("this customer token acts for one end user: leave end_user out or name that one")
    return token.end_user


def customer_token_verify(raw: str) -> Verified:
    """Find and check ``raw``. Never says to the caller which part was wrong (the state is for the audit)."""
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != CUSTOMER_TOKEN_PREFIX or not (1 <= len(parts[1]) <= 16) or len(raw) > 300:
        return Verified(None, "invalid")
    token = CustomerToken.objects.select_related("tenant", "tenant__operator").filter(prefix=parts[1]).first()
    if token is None:
        return Verified(None, "invalid")
    if not hmac.compare_digest(token.secret_hash, token_secret_hash(parts[2])):
        return Verified(token, "invalid")
    if token.revoked_at is not None:
        return Verified(token, "revoked")
    if token.expires_at <= timezone.now():
        return Verified(token, "expired")
    if token.tenant.status in TENANT_GONE:
        return Verified(token, "tenant deprovisioned")
    return Verified(token, "ok")


def customer_token_refused(*, token: CustomerToken, reason: str, path: str, method: str) -> None:
    """The audit row of a refused use (expired, revoked, wrong secret, another tenant, operator endpoint)."""
    audit_record(actor=customer_token_actor(token), action=AuditAction.CUSTOMER_TOKEN_REFUSED, target=token,
                 tenant=token.tenant, data={"prefix": token.prefix, "reason": reason, "path": path[:300],
                                            "method": method})


def customer_token_revoke(*, tenant: Tenant, prefix: str, actor: Actor) -> CustomerToken:
    with transaction.atomic():
        token = CustomerToken.objects.select_for_update().filter(tenant=tenant, prefix=prefix).first()
        if token is None:
            raise NotFound("customer token not found")
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            audit_record(actor=actor, action=AuditAction.CUSTOMER_TOKEN_REVOKE, target=token, tenant=tenant,
                         data={"prefix": prefix})
    return token
