"""Reads: an operator's rules, a tenant's allow-list (what its proxy enforces) and its decision log."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q, QuerySet

from controlplane.errors import NotFound
from releases.models import ReleaseAssignment
from tenants.choices import TenantStatus
from tenants.models import Operator, Tenant

from .models import EgressDecision, EgressRule
from .rules import AllowList, HostRule

__all__ = ["allow_list_for_tenant", "decision_list", "rule_get", "rule_list"]


def rule_list(*, operator: Operator, tenant_id: str | None = None, release_id: str | None = None
              ) -> QuerySet[EgressRule]:
    rules = EgressRule.objects.filter(operator=operator)
    if tenant_id is not None:
        rules = rules.filter(tenant_id=tenant_id)
    if release_id is not None:
        rules = rules.filter(release_id=release_id)
    return rules


def rule_get(*, operator: Operator, rule_id: object) -> EgressRule:
    """Another operator's rule (or a malformed id) is NotFound, like one that does not exist."""
    try:
        return EgressRule.objects.get(operator=operator, pk=rule_id)
    except (EgressRule.DoesNotExist, DjangoValidationError, ValueError):
        raise NotFound("egress rule not found") from None


def allow_list_for_tenant(*, tenant_id: object) -> AllowList:
    """The union of the tenant's operator's rules for all its customers, for the release the tenant runs (and the
    ones it keeps loadable to finish tasks on, ``ReleaseAssignment.retained``) and for the tenant itself. An
    unknown or deleted tenant gets the empty list: everything refused."""
    tenant = Tenant.objects.filter(pk=tenant_id).exclude(status=TenantStatus.DELETED).only("operator_id").first()
    if tenant is None:
        return AllowList()
    scope = Q(tenant__isnull=True, release__isnull=True) | Q(tenant_id=tenant.pk)
    assignment = ReleaseAssignment.objects.filter(tenant_id=tenant.pk).first()
    if assignment is not None:
        releases = [str(r) for r in ([assignment.release_id] if assignment.release_id else [])
                    + list(assignment.retained or [])]
        if releases:
            scope |= Q(release_id__in=releases)
    rows = EgressRule.objects.filter(scope, operator_id=tenant.operator_id).values_list("host", "port")
    return AllowList.of(HostRule(host, port) for host, port in rows)


def decision_list(*, tenant: Tenant) -> QuerySet[EgressDecision]:
    return EgressDecision.objects.filter(tenant=tenant).order_by("-id")
