"""Receivers of other apps' signals, connected in ``WebhooksConfig.ready``; the work itself is in ``services``."""

from __future__ import annotations

from typing import Any

from tenants.models import AuditLog, Tenant

from .services import event_record_from_audit

__all__ = ["event_from_audit_row"]


def event_from_audit_row(sender: object, *, row: AuditLog, tenant: Tenant | None, **kwargs: Any) -> None:
    """``tenants.audit.audit_recorded``: the public event the row describes, if any, in the audit's transaction."""
    event_record_from_audit(row=row, tenant=tenant)
