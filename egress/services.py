"""Writes: an operator's rules (audited in the same transaction) and the proxy's decision log (bounded)."""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.errors import Conflict, ValidationFailed
from releases.models import AgentRelease
from tenants.actors import Actor
from tenants.audit import AuditAction, audit_record
from tenants.models import Operator, Tenant

from .models import EgressDecision, EgressRule
from .proxy import Decision
from .rules import rule_parse

__all__ = ["decision_record", "rule_create", "rule_delete"]


def rule_create(*, operator: Operator, host: str, port: int | None = None, tenant: Tenant | None = None,
                release: AgentRelease | None = None, note: str = "", actor: Actor) -> EgressRule:
    """One more ``host[:port]`` for all the operator's customers, the tenants on ``release`` or ``tenant`` alone.
    The caller has already looked ``tenant``/``release`` up through ``operator`` (another operator's is a 404)."""
    if tenant is not None and release is not None:
        raise ValidationFailed("a rule applies to one tenant or to one release, not both")
    if (tenant is not None and tenant.operator_id != operator.pk) or (
            release is not None and release.operator_id != operator.pk):
        raise ValidationFailed("tenant or release of another operator")
    try:
        rule = rule_parse(host, port)
    except ValueError as error:
        raise ValidationFailed(f"host: {error}") from None
    if EgressRule.objects.filter(operator=operator).count() >= settings.EGRESS_MAX_RULES_PER_OPERATOR:
        raise ValidationFailed(f"at most {settings.EGRESS_MAX_RULES_PER_OPERATOR} egress rules per operator")
    try:
        with transaction.atomic():
            made = EgressRule.objects.create(operator=operator, tenant=tenant, release=release, host=rule.host,
                                             port=rule.port, note=note, created_by=actor.label[:200])
            audit_record(actor=actor, action=AuditAction.EGRESS_RULE_CREATE, target=made, tenant=tenant,
                         operator=operator, data={"host": str(rule), "release": str(release.pk) if release else None})
    except IntegrityError:
        raise Conflict(f"{rule} is already allowed in this scope") from None
    return made


@transaction.atomic
def rule_delete(*, rule: EgressRule, actor: Actor) -> None:
    """Takes effect at each proxy's next allow-list refresh (``EGRESS_RULES_REFRESH_S``); open tunnels are not
    cut."""
    audit_record(actor=actor, action=AuditAction.EGRESS_RULE_DELETE, target=rule, tenant=rule.tenant,
                 operator=rule.operator, data={"host": str(rule)})
    rule.delete()


def decision_record(*, tenant_id: object, decision: Decision) -> None:
    """Append one decision and drop the tenant's rows beyond the newest ``EGRESS_LOG_KEEP_PER_TENANT`` (an index
    scan on (tenant, -id)): a tenant hammering refused hosts fills its own window, nobody else's, and never the
    disk."""
    keep = settings.EGRESS_LOG_KEEP_PER_TENANT
    with transaction.atomic():
        EgressDecision.objects.create(
            tenant_id=tenant_id, allowed=decision.allowed, reason=decision.reason, kind=decision.kind,
            host=decision.host[:255], port=decision.port, bytes_up=decision.bytes_up, bytes_down=decision.bytes_down,
            duration_ms=min(decision.duration_ms, 2**31 - 1))
        oldest_kept = (EgressDecision.objects.filter(tenant_id=tenant_id).order_by("-id")
                       .values_list("id", flat=True)[keep - 1:keep].first())
        if oldest_kept is not None:
            EgressDecision.objects.filter(tenant_id=tenant_id, id__lt=oldest_kept).delete()
