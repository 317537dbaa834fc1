"""Operator API tokens: issue (shown once), verify, revoke. Only a SHA-256 of the secret is stored.

Tokens are 256-bit random values, so a fast hash is enough (no password stretching needed);
the lookup prefix lets us find the row without scanning, and the compare is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from controlplane.db.rows import model_columns, model_row
from controlplane.errors import NotFound, ValidationFailed

from .actors import Actor
from .audit import audit_record
from .audit_actions import AuditAction
from .choices import ALL_TOKEN_SCOPES, TENANT_GONE
from .models import Operator, OperatorToken, Tenant

__all__ = ["CredentialsChanged", "IssuedToken", "Recheck", "operator_token_issue", "operator_token_revoke",
           "operator_token_verify", "operator_token_verify_for_tenant", "operator_token_verify_for_tenant_cached",
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


def _split(raw: str) -> tuple[str, str] | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    return parts[1], parts[2]


def _live(token: OperatorToken | None, secret: str) -> OperatorToken | None:
    """``token`` if it is not revoked and ``secret`` is its own (constant-time), its use noted once a minute."""
    if token is None or token.revoked_at is not None:
        return None
    if not hmac.compare_digest(token.secret_hash, token_secret_hash(secret)):
        return None
    _note_use(token)
    return token


def operator_token_verify(raw: str) -> OperatorToken | None:
    """Return the live token for ``raw`` or None. Never says which part was wrong."""
    split = _split(raw)
    if split is None:
        return None
    token = OperatorToken.objects.select_related("operator").filter(prefix=split[0]).first()
    return _live(token, split[1])


def operator_token_verify_for_tenant(raw: str, tenant_id: object) -> tuple[OperatorToken | None, Tenant | None]:
    """``operator_token_verify`` and the operator's live tenant ``tenant_id`` (None when it is another operator's,
    missing or being deleted) in one statement: the hot path of the tenant APIs (issue 39: the ORM's two queries
    cost 5 ms; this one, parameterised, under 1 ms). Never cached, so a revoke or a tenant's new status counts
    from the next request on (``operator_token_verify_for_tenant_cached`` is for writes that confirm it)."""
    token, tenant, _ = _verify_for_tenant(raw, tenant_id)
    return token, tenant


def _verify_for_tenant(raw: str, tenant_id: object,
                       ) -> tuple[OperatorToken | None, Tenant | None, tuple[Any, ...] | None]:
    """(token, tenant, the row they were built from) of ``operator_token_verify_for_tenant``."""
    split = _split(raw)
    if split is None:
        return None, None, None
    try:
        pk = uuid.UUID(str(tenant_id))
    except ValueError:
        pk = None
    gone = ", ".join(["%s"] * len(TENANT_GONE))
    # Only names from the models' own metadata are formatted in; every value is a parameter.
    sql = (f"SELECT {_joined_columns()} FROM {OperatorToken._meta.db_table} k "  # noqa: S608
           f"JOIN {Operator._meta.db_table} o ON o.id = k.operator_id "
           f"LEFT JOIN {Tenant._meta.db_table} n ON n.operator_id = k.operator_id AND n.id = %s "
           f"AND n.status NOT IN ({gone}) WHERE k.prefix = %s LIMIT 1")
    with connection.cursor() as cursor:
        cursor.execute(sql, [pk, *(str(s) for s in TENANT_GONE), split[0]])
        row = cursor.fetchone()
    if row is None:
        return None, None, None
    token, tenant = _models(row)
    if _live(token, split[1]) is None:
        return None, None, None
    return token, tenant, row


def _joined_columns() -> str:
    return ", ".join(model_columns(m, a)[1] for m, a in ((OperatorToken, "k"), (Operator, "o"), (Tenant, "n")))


def _models(row: tuple[Any, ...]) -> tuple[OperatorToken, Tenant | None]:
    """Fresh instances (never shared between requests) from a row of ``_verify_for_tenant``'s statement."""
    t_fields, _ = model_columns(OperatorToken, "k")
    o_fields, _ = model_columns(Operator, "o")
    n_fields, _ = model_columns(Tenant, "n")
    nt, no = len(t_fields), len(o_fields)
    token = model_row(OperatorToken, t_fields, row)
    operator = model_row(Operator, o_fields, row, nt)
    token.operator = operator
    tenant = None
    if row[nt + no] is not None:
        tenant = model_row(Tenant, n_fields, row, nt + no)
        tenant.operator = operator
    return token, tenant


class CredentialsChanged(Exception):  # noqa: N818 - a signal to re-authenticate, not an error of the caller's
    """A write found that what a cached verification took for granted (``Recheck``) no longer holds; the write
    was undone, and the request is authenticated again, uncached, before anything else happens."""


@dataclass(frozen=True)
class Recheck:
    """What ``operator_token_verify_for_tenant_cached`` took for granted on a cache hit: the token not revoked
    (nor gone), the tenant still the token's operator's, with the status and plan it had. The write acting on it
    confirms all of it inside its own statement (``condition``), in the transaction of what it writes, so a revoke
    or a tenant's new status counts from the next request on, as it does uncached; ``holds`` is the same check as
    a statement of its own, for a write that takes another path (a retried Idempotency-Key)."""

    token_id: uuid.UUID
    operator_id: uuid.UUID
    tenant_id: uuid.UUID
    tenant_status: str
    plan_id: str

    def condition(self) -> tuple[str, list[Any]]:
        """An SQL boolean expression and its parameters: two lookups by primary key, not a join (a third of the
        cost to plan, measured inside the message's statement)."""
        sql = (f"coalesce((SELECT revoked_at IS NULL FROM {OperatorToken._meta.db_table} "  # noqa: S608 - names only
               "WHERE id = %s AND operator_id = %s), false) AND coalesce((SELECT status = %s AND plan = %s "
               f"FROM {Tenant._meta.db_table} WHERE id = %s AND operator_id = %s), false)")
        return sql, [self.token_id, self.operator_id, self.tenant_status, self.plan_id, self.tenant_id,
                     self.operator_id]

    def holds(self) -> bool:
        sql, params = self.condition()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}", params)
            return bool(cursor.fetchone()[0])


# Verified (token, tenant) rows by SHA-256 of the raw token and the tenant id asked, for writes that confirm them
# (``Recheck``): issue 39, the lookup was a round trip of every message's ~1 ms. A process's own memory, bounded;
# an entry lives at most a minute, so a token's use is still noted about once a minute (``_note_use``).
VERIFIED_CACHE_TTL_S = 60.0
VERIFIED_CACHE_MAX = 4096
_verified: dict[tuple[bytes, str], tuple[float, tuple[Any, ...]]] = {}
_verified_lock = threading.Lock()


def operator_token_verify_for_tenant_cached(raw: str, tenant_id: object, *, fresh: bool = False,
                                            ) -> tuple[OperatorToken | None, Tenant | None, Recheck | None]:
    """``operator_token_verify_for_tenant`` for a write that confirms the answer in its own statement: a hit
    returns what was verified before with the ``Recheck`` the write must pass (None on a miss: verified now).
    Only a live token with its live tenant is kept; ``fresh``: verify now, and keep or drop the entry by the
    answer (after ``CredentialsChanged``)."""
    key = (hashlib.sha256(raw.encode()).digest(), str(tenant_id))
    now = time.monotonic()
    hit = None if fresh else _verified.get(key)
    if hit is not None and hit[0] > now:
        # Lists (array columns: the token's scopes, the operator's domains) are copied, so nothing a request does
        # to its instances reaches the next one; JSON is parsed afresh by the converters.
        kept, kept_tenant = _models(tuple(list(v) if isinstance(v, list) else v for v in hit[1]))
        if kept_tenant is not None:  # always so: only such rows are kept
            return kept, kept_tenant, Recheck(token_id=kept.pk, operator_id=kept.operator_id, tenant_id=kept_tenant.pk,
                                              tenant_status=kept_tenant.status, plan_id=kept_tenant.plan_id)
    token, tenant, row = _verify_for_tenant(raw, tenant_id)
    with _verified_lock:
        if token is None or tenant is None or row is None:
            _verified.pop(key, None)
        else:
            _verified.pop(key, None)  # re-inserted last: the order stays oldest first
            while len(_verified) >= VERIFIED_CACHE_MAX:
                del _verified[next(iter(_verified))]  # the oldest entry
            _verified[key] = (now + VERIFIED_CACHE_TTL_S, row)
    return token, tenant, None


def _note_use(token: OperatorToken) -> None:
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        OperatorToken.objects.filter(pk=token.pk).update(last_used_at=now)


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
