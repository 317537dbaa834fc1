"""Portal reads: a customer's recovery history and usage, and the team.

Usage comes from one place, the ``UsageDay`` rows the usage app collects from the instance's own tables
(``usage.selectors.usage_totals``): the same numbers the usage API and its CSV export give, counted where the
chat and the task list read theirs (the instance's messages and tasks), never from the inbox, which sees only
what passed through the control plane. The inbox adds only what has not reached the instance yet (waiting,
refused); recoveries and resources are the control plane's own rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from branding.choices import RevisionStatus
from branding.models import BrandingRevision
from branding.selectors import latest_revision, portal_theme
from conversations.choices import InboxKind, InboxStatus
from conversations.models import InboxItem
from conversations.monthly_limits import MonthlyUse, monthly_limits
from provisioning.choices import RecoveryOutcome, RecoveryReason
from provisioning.models import ProvisionedResource, RecoveryEvent
from provisioning.resources.kinds import resource_kind
from provisioning.selectors import recovery_event_list
from tenants.models import Operator, Tenant
from usage.selectors import UsageTotals, usage_period, usage_totals

from .models import OperatorInvitation, OperatorMembership

__all__ = ["RecoveryRow", "CustomerUsage", "customer_recoveries", "customer_usage", "team_members",
           "pending_invitations", "BrandingFormState", "branding_form_state", "RECOVERY_HISTORY_LIMIT"]

RECOVERY_HISTORY_LIMIT = 20

# Why an instance was recovered, for people who never saw the code.
_REASON_TEXT = {
    RecoveryReason.DEAD: "The agent stopped unexpectedly",
    RecoveryReason.HUNG: "The agent stopped making progress",
    RecoveryReason.DRIFT: "A resource was missing or changed",
    RecoveryReason.UNHEALTHY: "The agent failed its health check",
    RecoveryReason.MANUAL: "Recovery requested by support",
}
_OUTCOME_TEXT = {
    RecoveryOutcome.PENDING: "waiting", RecoveryOutcome.RUNNING: "in progress",
    RecoveryOutcome.SUCCEEDED: "resumed", RecoveryOutcome.FAILED: "failed",
    RecoveryOutcome.QUARANTINED: "paused for support",
}


@dataclass(frozen=True)
class RecoveryRow:
    """One recovery as an operator reads it: no internal detail text (it can name hosts and processes)."""

    detected_at: datetime
    reason: str
    reason_text: str
    outcome: str
    outcome_text: str
    time_to_recover_s: float | None
    from_checkpoint: str
    steps_lost: int | None


@dataclass(frozen=True)
class CustomerUsage:
    period: UsageTotals  # this month so far, from UsageDay (the usage API's numbers)
    messages_waiting: int  # in the inbox, not delivered to the instance yet
    messages_refused: int
    recoveries: int
    recoveries_30d: int
    resources: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, label, status)
    limits: list[MonthlyUse] = field(default_factory=list)  # the plan's monthly limits, set ones only


def _row(event: RecoveryEvent) -> RecoveryRow:
    return RecoveryRow(
        detected_at=event.detected_at, reason=event.reason,
        reason_text=_REASON_TEXT.get(event.reason, event.get_reason_display()),
        outcome=event.outcome, outcome_text=_OUTCOME_TEXT.get(event.outcome, event.outcome),
        time_to_recover_s=event.time_to_recover_s, from_checkpoint=event.from_checkpoint,
        steps_lost=event.steps_lost,
    )


def customer_recoveries(tenant: Tenant, limit: int = RECOVERY_HISTORY_LIMIT) -> list[RecoveryRow]:
    """Newest first; the same rows the staff dashboard shows (``provisioning.selectors.recovery_event_list``)."""
    return [_row(event) for event in recovery_event_list(tenant=tenant)[:limit]]


def customer_usage(tenant: Tenant) -> CustomerUsage:
    """This month's usage (the usage API's rows), what still waits in the inbox, recoveries and resources."""
    start, end = usage_period(None, None)
    inbox = InboxItem.objects.filter(tenant=tenant, kind=InboxKind.MESSAGE).aggregate(
        waiting=Count("id", filter=Q(status=InboxStatus.PENDING)),
        refused=Count("id", filter=Q(status=InboxStatus.REFUSED)),
    )
    since = timezone.now() - timedelta(days=30)
    recoveries = RecoveryEvent.objects.filter(tenant=tenant).aggregate(
        total=Count("id"), recent=Count("id", filter=Q(detected_at__gte=since)))
    resources = [(r.kind, resource_kind(r.kind).label, r.status)
                 for r in ProvisionedResource.objects.filter(tenant=tenant).order_by("id")]
    return CustomerUsage(
        period=usage_totals(tenant=tenant, start=start, end=end), messages_waiting=inbox["waiting"],
        messages_refused=inbox["refused"], recoveries=recoveries["total"], recoveries_30d=recoveries["recent"],
        resources=resources,
        limits=[use for use in monthly_limits(tenant=tenant) if use.limit is not None],
    )


def team_members(operator: Operator) -> QuerySet[OperatorMembership]:
    return OperatorMembership.objects.filter(operator=operator).select_related("user").order_by("user__username")


def pending_invitations(operator: Operator) -> QuerySet[OperatorInvitation]:
    """Invitations not yet accepted nor withdrawn, expired ones included (shown as expired, so they can be
    sent again)."""
    return OperatorInvitation.objects.filter(operator=operator, accepted_at__isnull=True,
                                             revoked_at__isnull=True).order_by("-created_at")


@dataclass(frozen=True)
class BrandingFormState:
    """What the branding form starts from. ``revision`` is set when those are a submission's values (still
    being checked, or rejected with ``errors``) rather than the published theme's."""

    values: dict[str, str]
    revision: BrandingRevision | None = None
    errors: list[dict[str, str]] = field(default_factory=list)


def branding_form_state(operator: Operator) -> BrandingFormState:
    """The published theme's values, unless the latest submission is still pending or was rejected: then
    the operator's own edits, so a rejection (decided later, by the job) never throws them away."""
    revision = latest_revision(operator)
    if revision is not None and revision.status in (RevisionStatus.PENDING, RevisionStatus.REJECTED):
        values = {"product_name": revision.product_name, "primary_color": revision.primary_color,
                  "background_color": revision.background_color, "support_email": revision.support_email}
        errors = list(revision.errors) if revision.status == RevisionStatus.REJECTED else []
        return BrandingFormState(values=values, revision=revision, errors=errors)
    theme = portal_theme(operator)
    return BrandingFormState(values={"product_name": theme.product_name, "primary_color": theme.primary,
                                     "background_color": theme.background, "support_email": theme.support_email})
