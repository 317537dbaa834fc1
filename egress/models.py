"""Egress allow-list rules (the operator's input) and the per-tenant decision log (the proxy's output)."""

from __future__ import annotations

import uuid

from django.db import models

from releases.models import AgentRelease
from tenants.models import Operator, Tenant

from .choices import DecisionReason, RequestKind

__all__ = ["EgressDecision", "EgressRule"]


class EgressRule(models.Model):
    """One ``host[:port]`` an operator lets its customers' agents reach. Its scope is the operator's customers
    (no tenant, no release), the tenants running one release (``release``), or one tenant (``tenant``); a
    tenant's allow-list is the union of the three (``egress.selectors.allow_list_for_tenant``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="egress_rules")
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="egress_rules")
    release = models.ForeignKey(AgentRelease, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    host = models.CharField(max_length=255, help_text="an exact host or *.suffix, normalized (egress.rules)")
    port = models.PositiveIntegerField(null=True, blank=True, help_text="null: the web ports, 443 and 80")
    note = models.CharField(max_length=200, blank=True, help_text="why: 'the model provider', 'payments'")
    created_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["host", "port"]
        constraints = [
            models.CheckConstraint(condition=~models.Q(tenant__isnull=False, release__isnull=False),
                                   name="egress_rule_one_scope"),
            models.UniqueConstraint(fields=["operator", "tenant", "release", "host", "port"],
                                    nulls_distinct=False, name="egress_rule_unique"),
        ]

    def __str__(self) -> str:
        return self.host if self.port is None else f"{self.host}:{self.port}"


class EgressDecision(models.Model):
    """One request through a tenant's egress proxy. Bounded: ``EGRESS_LOG_KEEP_PER_TENANT`` newest rows per
    tenant (``egress.services.decision_record`` prunes the rest). Only the destination, never a path, query,
    header or body: those may carry the customer's data or credentials."""

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="egress_decisions")
    at = models.DateTimeField(auto_now_add=True)
    allowed = models.BooleanField()
    reason = models.CharField(max_length=30, choices=DecisionReason.choices)
    kind = models.CharField(max_length=10, choices=RequestKind.choices)
    host = models.CharField(max_length=255, blank=True)
    port = models.PositiveIntegerField(default=0)
    bytes_up = models.BigIntegerField(default=0)
    bytes_down = models.BigIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "-id"], name="egress_decision_tenant_newest")]

    def __str__(self) -> str:
        return f"{'allowed' if self.allowed else 'refused'} {self.host}:{self.port}"
