"""Reads: an operator's rules, a tenant's allow-list (what its proxy enforces) and its decision log."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q, QuerySet

from controlplane.errors import NotFound
from releases.models import AgentRelease, ReleaseAssignment
from tenants.choices import TenantStatus
from tenants.models import Operator, Tenant

from .models import EgressDecision, EgressRule
from .rules import AllowList, HostRule, rule_parse

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
    ones it keeps loadable to finish tasks on, ``ReleaseAssignment.retained``) and for the tenant itself, and the
    hosts those releases declare themselves (``Agent(egress=...)``, web ports only). An unknown or deleted tenant
    gets the empty list: everything refused."""
    tenant = Tenant.objects.filter(pk=tenant_id).exclude(status=TenantStatus.DELETED).only("operator_id").first()
    if tenant is None:
        return AllowList()
    scope = Q(tenant__isnull=True, release__isnull=True) | Q(tenant_id=tenant.pk)
    assignment = ReleaseAssignment.objects.filter(tenant_id=tenant.pk).first()
    declared: list[HostRule] = []
    if assignment is not None:
        releases = [str(r) for r in ([assignment.release_id] if assignment.release_id else [])
                    + list(assignment.retained or [])]
        if releases:
            scope |= Q(release_id__in=releases)
            declared = _release_hosts(operator_id=tenant.operator_id, release_ids=releases)
    rows = EgressRule.objects.filter(scope, operator_id=tenant.operator_id).values_list("host", "port")
    return AllowList.of([*(HostRule(host, port) for host, port in rows), *declared])


def _release_hosts(*, operator_id: object, release_ids: list[str]) -> list[HostRule]:
    """The hosts these releases (the operator's own) declared at upload, checked then, each on the web ports. One
    that no longer parses, or names a port (never stored so), is skipped: never widened."""
    rules: list[HostRule] = []
    for hosts in AgentRelease.objects.filter(pk__in=release_ids, operator_id=operator_id).values_list("egress",
                                                                                                    flat=True):
        for host in hosts or []:
            if not isinstance(host, str) or ":" in host:
                continue
            try:
                rules.append(rule_parse(host))
            except ValueError:
                continue
    return rules


def decision_list(*, tenant: Tenant) -> QuerySet[EgressDecision]:
    return EgressDecision.objects.filter(tenant=tenant).order_by("-id")
