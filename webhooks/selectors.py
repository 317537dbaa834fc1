"""Reads, always through the caller's operator: another operator's event, endpoint or delivery is not found.

The one exception is ``event_list_all``, for the staff dashboard (staff see every operator); nothing an
operator or a customer can reach calls it.
"""

from __future__ import annotations

from datetime import datetime

from django.core.exceptions import ValidationError
from django.db.models import Prefetch, QuerySet

from controlplane.errors import NotFound
from tenants.models import Operator

from .models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint

__all__ = ["event_list", "event_list_all", "event_get", "endpoint_list", "endpoint_get", "delivery_list",
           "delivery_get", "attempt_list"]


def event_list(*, operator: Operator, type: str | None = None, tenant_id: str | None = None,
               created_after: datetime | None = None, created_before: datetime | None = None) -> QuerySet[Event]:
    """Newest first. ``type`` is an exact type or ``<prefix>.*``."""
    qs = _of_type(Event.objects.filter(operator=operator), type)
    if tenant_id:
        qs = qs.filter(tenant_id=tenant_id)
    if created_after is not None:
        qs = qs.filter(created_at__gte=created_after)
    if created_before is not None:
        qs = qs.filter(created_at__lt=created_before)
    return qs.order_by("-id")


def _of_type(qs: QuerySet[Event], type: str | None) -> QuerySet[Event]:
    if not type:
        return qs
    return qs.filter(type__startswith=type[:-1]) if type.endswith(".*") else qs.filter(type=type)


def event_list_all(*, type: str | None = None, operator_slug: str | None = None,
                   tenant_slug: str | None = None) -> QuerySet[Event]:
    """Every operator's events, newest first, for staff. ``type`` as in ``event_list``; a tenant is named by
    its slug because that is what staff read on every screen (slugs repeat across operators, so naming the
    operator too narrows it to one tenant). Each event's deliveries and their attempts come prefetched (the
    dashboard's delivery log): three queries a page, whatever its length."""
    deliveries = WebhookDelivery.objects.select_related("endpoint").prefetch_related("attempt_log").order_by(
        "created_at", "pk")
    qs = _of_type(Event.objects.select_related("operator", "tenant")
                  .prefetch_related(Prefetch("deliveries", queryset=deliveries)), type)
    if operator_slug:
        qs = qs.filter(operator__slug=operator_slug)
    if tenant_slug:
        qs = qs.filter(tenant__slug=tenant_slug)
    return qs.order_by("-id")


def event_get(*, operator: Operator, event_id: str) -> Event:
    event = Event.objects.filter(operator=operator, pk=event_id).first()
    if event is None:
        raise NotFound("event not found")
    return event


def endpoint_list(*, operator: Operator) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(operator=operator, deleted_at__isnull=True).order_by("-created_at")


def endpoint_get(*, operator: Operator, endpoint_id: object) -> WebhookEndpoint:
    try:
        endpoint = endpoint_list(operator=operator).filter(pk=endpoint_id).first()
    except (ValueError, TypeError, ValidationError):  # not a UUID: no such endpoint
        endpoint = None
    if endpoint is None:
        raise NotFound("webhook endpoint not found")
    return endpoint


def delivery_list(*, endpoint: WebhookEndpoint, status: str | None = None) -> QuerySet[WebhookDelivery]:
    qs = WebhookDelivery.objects.filter(endpoint=endpoint).select_related("event")
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("-created_at", "-pk")


def delivery_get(*, operator: Operator, delivery_id: object) -> WebhookDelivery:
    try:
        delivery = (WebhookDelivery.objects.select_related("event", "endpoint")
                    .filter(endpoint__operator=operator, endpoint__deleted_at__isnull=True, pk=delivery_id).first())
    except (ValueError, TypeError, ValidationError):
        delivery = None
    if delivery is None:
        raise NotFound("webhook delivery not found")
    return delivery


def attempt_list(*, delivery: WebhookDelivery) -> QuerySet[WebhookAttempt]:
    return WebhookAttempt.objects.filter(delivery=delivery).order_by("number")
