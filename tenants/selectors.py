"""Tenant and operator reads, always scoped to the caller's operator."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from controlplane.errors import NotFound

from .choices import TENANT_GONE
from .models import Operator, Tenant

__all__ = ["tenant_list", "tenant_get"]


def tenant_list(*, operator: Operator, status: str | None = None) -> QuerySet[Tenant]:
    qs = Tenant.objects.filter(operator=operator).select_related("instance", "plan").prefetch_related("resources")
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("-created_at", "id")


def tenant_get(*, operator: Operator, tenant_id: object, live: bool = False) -> Tenant:
    """Another operator's tenant and a tenant that does not exist look the same: 404.

    ``live``: a tenant being deprovisioned or deleted is gone for the API's detail routes (404, as after any
    DELETE); lists still show it under its status.
    """
    try:
        pk = uuid.UUID(str(tenant_id))
    except ValueError:
        raise NotFound("tenant not found") from None
    tenants = tenant_list(operator=operator).filter(pk=pk)
    if live:
        tenants = tenants.exclude(status__in=TENANT_GONE)
    tenant = tenants.first()
    if tenant is None:
        raise NotFound("tenant not found")
    return tenant
