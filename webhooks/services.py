"""Writes: events (from the audit trail), endpoints, deliveries and their attempts.

Delivery is at least once. An event and its deliveries commit with the change they describe; the Celery
task is queued after commit, and the beat sweep re-queues any due delivery whose message was lost, so a
broker outage delays a webhook but never drops it. Each attempt holds a lease on its row, so a duplicate
message does not post twice at once; a worker killed mid-request leaves the lease to expire and the
delivery is posted again, with the same ``webhook-id``, which is what receivers de-duplicate on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, overload

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from controlplane.errors import Conflict, ValidationFailed
from controlplane.hostpaths import scrub_json
from tenants.actors import Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.models import AuditLog, Operator, Tenant
from vault.wrapped_rows import row_secret_read, row_secret_wrap, wrapped_rows_source

from .choices import EVENT_TYPE_PREFIXES, DeliveryStatus, EndpointStatus, EventType
from .events import event_from_audit
from .models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from .signing import new_secret, signed_headers
from .targets import post_signed, target_check

__all__ = [
    "AttemptResult", "CreatedEndpoint", "event_record", "event_record_from_audit", "event_payload",
    "event_types_validate",
    "endpoint_create", "endpoint_update", "endpoint_delete", "endpoint_test", "delivery_attempt",
    "delivery_replay", "deliveries_queue_due", "retry_waits_in_queue",
]

MAX_URL_CHARS = 2000
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CreatedEndpoint:
    """An endpoint and its secret: the only time the secret exists outside its wrapping."""

    endpoint: WebhookEndpoint
    secret: str = field(repr=False)  # never in a repr, whatever prints this


# --- events ---------------------------------------------------------------------------------------------


def _subscribed(endpoint: WebhookEndpoint, event_type: str) -> bool:
    if not endpoint.event_types:
        return True
    prefix = event_type.split(".", 1)[0] + ".*"
    return event_type in endpoint.event_types or prefix in endpoint.event_types


def _queue(delivery_ids: Sequence[str]) -> None:
    if not delivery_ids:
        return
    from .tasks import webhook_deliver_task

    def send() -> None:
        for delivery_id in delivery_ids:
            try:
                webhook_deliver_task.delay(delivery_id)
            except Exception:  # noqa: BLE001 - broker down: the committed row is found by the sweep later
                log.warning("webhooks: could not queue delivery %s; the sweep will", delivery_id)

    transaction.on_commit(send)


@overload
def event_record(*, operator_id: object, tenant: Tenant | None, type: str, data: dict[str, Any],
                 endpoints: Sequence[WebhookEndpoint] | None = None, fact_key: None = None) -> Event: ...
@overload
def event_record(*, operator_id: object, tenant: Tenant | None, type: str, data: dict[str, Any],
                 endpoints: Sequence[WebhookEndpoint] | None = None, fact_key: str) -> Event | None: ...
def event_record(*, operator_id: object, tenant: Tenant | None, type: str, data: dict[str, Any],
                 endpoints: Sequence[WebhookEndpoint] | None = None, fact_key: str | None = None) -> Event | None:
    """Record an event and one delivery per subscribed endpoint, in the caller's transaction.

    ``endpoints``: deliver to exactly these instead (the test button), whatever their type filter says.
    ``fact_key``: the fact the event reports, unique per tenant; None (nothing recorded, nothing sent) when an
    event of this tenant already reported it, however the fact was detected twice (two sweeps racing too).
    """
    with transaction.atomic():
        # Whatever a builder let through, an event names no path on this host (docs/api.md).
        event = Event(operator_id=operator_id, tenant=tenant, type=type, data=scrub_json(data), fact_key=fact_key)
        if fact_key is None:
            event.save(force_insert=True)
        else:
            try:
                with transaction.atomic():  # a savepoint: a duplicate fact leaves the caller's transaction usable
                    event.save(force_insert=True)
            except IntegrityError:
                return None
        if endpoints is None:
            endpoints = [e for e in WebhookEndpoint.objects.filter(operator_id=operator_id, is_active=True,
                                                                   deleted_at__isnull=True) if _subscribed(e, type)]
        now = timezone.now()
        deliveries = [WebhookDelivery(endpoint=e, event=event, next_attempt_at=now) for e in endpoints]
        WebhookDelivery.objects.bulk_create(deliveries)
        _queue([str(d.pk) for d in deliveries])
    return event


def event_record_from_audit(*, row: AuditLog, tenant: Tenant | None) -> Event | None:
    """For every audit row (``tenants.audit.audit_recorded``): records the public event it describes, if any."""
    if row.operator_id is None:
        return None
    public = event_from_audit(action=row.action, data=row.data or {}, target_id=row.target_id,
                              tenant_slug=tenant.slug if tenant is not None else None,
                              tenant_status=tenant.status if tenant is not None else None)
    if public is None:
        return None
    return event_record(operator_id=row.operator_id, tenant=tenant, type=public.type, data=public.data)


def event_payload(event: Event) -> dict[str, Any]:
    """What the API shows and a webhook carries: the same object in both places."""
    return {"id": event.id, "object": "event", "type": event.type,
            "created_at": event.created_at.isoformat().replace("+00:00", "Z"),
            "tenant": str(event.tenant_id) if event.tenant_id else None, "data": event.data}


# --- endpoints ------------------------------------------------------------------------------------------


def event_types_validate(event_types: object) -> list[str]:
    if not isinstance(event_types, list) or not all(isinstance(t, str) for t in event_types):
        raise ValidationFailed("event_types must be a list of event types")
    unknown = sorted({t for t in event_types if t not in EventType.values
                      and not (t.endswith(".*") and t[:-2] in EVENT_TYPE_PREFIXES)})
    if unknown:
        raise ValidationFailed(f"unknown event types: {', '.join(unknown)} (exact types or '<prefix>.*')")
    return sorted(set(event_types))


def _url_validate(url: object) -> str:
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise ValidationFailed(f"url must be 1-{MAX_URL_CHARS} characters")
    target_check(url)
    return url


def _audit_data(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return {"endpoint": str(endpoint.pk), "url": endpoint.url, "event_types": endpoint.event_types}


def endpoint_create(*, operator: Operator, url: str, actor: Actor, description: str = "",
                    event_types: list[str] | None = None) -> CreatedEndpoint:
    url = _url_validate(url)
    event_types = event_types_validate(event_types or [])
    secret = new_secret()
    with transaction.atomic():
        Operator.objects.select_for_update().get(pk=operator.pk)  # the count below is per operator
        live = WebhookEndpoint.objects.filter(operator=operator, deleted_at__isnull=True).count()
        if live >= settings.WEBHOOK_MAX_ENDPOINTS:
            raise Conflict(f"an operator has at most {settings.WEBHOOK_MAX_ENDPOINTS} webhook endpoints")
        endpoint = WebhookEndpoint(operator=operator, url=url, description=description[:200],
                                   event_types=event_types, secret_hint=f"whsec_…{secret[-4:]}")
        row_secret_wrap(endpoint, _secret_context(endpoint), secret)
        endpoint.save()
        audit_record(actor=actor, action=AuditAction.WEBHOOK_ENDPOINT_CREATE, target=endpoint, operator=operator,
                     data=_audit_data(endpoint))
    return CreatedEndpoint(endpoint, secret)


def _secret_context(endpoint: WebhookEndpoint) -> str:
    # Bound to the endpoint: a wrapped secret copied onto another endpoint's row does not unwrap.
    return f"webhook-endpoint:{endpoint.pk}"


def _secret(endpoint: WebhookEndpoint) -> str:
    return row_secret_read(endpoint, _secret_context(endpoint))


# A KEK rotation re-wraps the endpoints' signing secrets after the data keys (registered in apps.py).
webhook_endpoint_secrets = wrapped_rows_source("webhook_endpoint_secrets", WebhookEndpoint, _secret_context)


def endpoint_update(*, endpoint: WebhookEndpoint, actor: Actor, url: str | None = None,
                    description: str | None = None, event_types: list[str] | None = None,
                    is_active: bool | None = None) -> WebhookEndpoint:
    changed: list[str] = []
    if url is not None:
        endpoint.url = _url_validate(url)
        changed.append("url")
    if description is not None:
        endpoint.description = description[:200]
        changed.append("description")
    if event_types is not None:
        endpoint.event_types = event_types_validate(event_types)
        changed.append("event_types")
    if is_active is not None:
        endpoint.is_active = is_active
        changed.append("is_active")
    if changed:
        with transaction.atomic():
            endpoint.save(update_fields=[*changed, "updated_at"])
            audit_record(actor=actor, action=AuditAction.WEBHOOK_ENDPOINT_UPDATE, target=endpoint,
                         operator=endpoint.operator, data={**_audit_data(endpoint), "changed": changed})
    return endpoint


def endpoint_delete(*, endpoint: WebhookEndpoint, actor: Actor) -> WebhookEndpoint:
    """Stop sending to it; the endpoint and its delivery log are kept (deliveries not yet made are cancelled)."""
    with transaction.atomic():
        endpoint.deleted_at = timezone.now()
        endpoint.is_active = False
        endpoint.save(update_fields=["deleted_at", "is_active", "updated_at"])
        WebhookDelivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.CANCELLED, next_attempt_at=None)
        audit_record(actor=actor, action=AuditAction.WEBHOOK_ENDPOINT_DELETE, target=endpoint,
                     operator=endpoint.operator,
                     data=_audit_data(endpoint))
    return endpoint


def endpoint_test(*, endpoint: WebhookEndpoint, actor: Actor) -> WebhookDelivery:
    """A ``webhook.test`` event delivered to this endpoint only, through the same queue as any other."""
    with transaction.atomic():
        event = event_record(operator_id=endpoint.operator_id, tenant=None, type=EventType.WEBHOOK_TEST,
                             data={"endpoint": str(endpoint.pk), "requested_by": actor.label[:200]},
                             endpoints=[endpoint])
        audit_record(actor=actor, action=AuditAction.WEBHOOK_ENDPOINT_TEST, target=endpoint, operator=endpoint.operator,
                     data={"endpoint": str(endpoint.pk), "event": event.id})
        return WebhookDelivery.objects.get(event=event, endpoint=endpoint)


# --- deliveries -----------------------------------------------------------------------------------------


def _lease_s() -> float:
    # Longer than any attempt can take (connect, send and read each bounded by the timeout).
    return settings.WEBHOOK_LEASE_S or settings.WEBHOOK_TIMEOUT_S * 3 + 30


def _claim(delivery_id: str, now: datetime) -> tuple[WebhookDelivery | None, bool]:
    """Lock the row briefly, take the lease and count the attempt; (row, whether to post now)."""
    with transaction.atomic():
        delivery = (WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
                    .select_related("endpoint", "event").filter(pk=delivery_id).first())
        if delivery is None:
            return None, False  # another worker holds the row this instant
        if delivery.status != DeliveryStatus.PENDING:
            return delivery, False
        if delivery.next_attempt_at is not None and delivery.next_attempt_at > now:
            return delivery, False  # not due (an early duplicate message)
        if delivery.lease_until is not None and delivery.lease_until > now:
            return delivery, False  # being posted by another worker
        if delivery.endpoint.deleted_at is not None:
            delivery.status, delivery.next_attempt_at = DeliveryStatus.CANCELLED, None
            delivery.save(update_fields=["status", "next_attempt_at"])
            return delivery, False
        delivery.attempts += 1
        delivery.run_attempts += 1
        delivery.lease_until = now + timedelta(seconds=_lease_s())
        delivery.save(update_fields=["attempts", "run_attempts", "lease_until"])
    return delivery, True


@dataclass(frozen=True)
class AttemptResult:
    delivery: WebhookDelivery | None
    posted: bool  # False: not due, not pending, or another worker has it (nothing was sent)


def delivery_attempt(*, delivery_id: str, now: datetime | None = None) -> AttemptResult:
    """Post one due delivery once and record the outcome: succeeded, the next attempt's time, or failed
    (schedule exhausted; the endpoint is then marked failing). A no-op for a delivery that is not due.

    ``now`` is the clock the schedule is computed on (the real time unless a caller replays a schedule);
    the signature's timestamp is always the real time, since that is what the receiver checks.
    """
    now = now or timezone.now()
    delivery, post = _claim(delivery_id, now)
    if delivery is None or not post:
        return AttemptResult(delivery, posted=False)
    endpoint, event = delivery.endpoint, delivery.event
    body = json.dumps(event_payload(event), separators=(",", ":"), sort_keys=True).encode()
    # Standard Webhooks: the event id is the webhook-id on every attempt and replay (the receiver's
    # de-duplication key); the timestamp and so the signature are this attempt's.
    headers = {
        **signed_headers(_secret(endpoint), event.id, int(time.time()), body),
        "webhook-delivery": str(delivery.pk),
        "webhook-attempt": str(delivery.attempts),
    }
    outcome = post_signed(endpoint.url, body, headers)
    with transaction.atomic():
        # The body as posted (signed, secret-free: the secret only keys the signature header, which is not
        # kept) and the receiver's answer as ``post_signed`` bounded it.
        WebhookAttempt.objects.create(delivery=delivery, number=delivery.attempts, attempted_at=now,
                                      duration_ms=outcome.duration_ms, status_code=outcome.status_code,
                                      error=outcome.error[:500], response_excerpt=outcome.response_excerpt[:500],
                                      request_body=body.decode(), response_body=outcome.response_body,
                                      response_truncated=outcome.response_truncated,
                                      response_headers=outcome.response_headers or {})
        delivery.last_attempt_at, delivery.last_status_code = now, outcome.status_code
        delivery.last_error, delivery.lease_until = outcome.error[:500], None
        if outcome.ok:
            delivery.status, delivery.delivered_at, delivery.next_attempt_at = DeliveryStatus.SUCCEEDED, now, None
            WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
                status=EndpointStatus.ACTIVE, failing_since=None, last_success_at=now)
        else:
            schedule: list[float] = settings.WEBHOOK_RETRY_SCHEDULE_S
            step = delivery.run_attempts - 1
            if step < len(schedule):
                delivery.next_attempt_at = now + timedelta(seconds=schedule[step])
            else:
                delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
                WebhookEndpoint.objects.filter(pk=endpoint.pk, failing_since__isnull=True).update(failing_since=now)
                WebhookEndpoint.objects.filter(pk=endpoint.pk).update(status=EndpointStatus.FAILING)
        delivery.save(update_fields=["last_attempt_at", "last_status_code", "last_error", "lease_until", "status",
                                     "delivered_at", "next_attempt_at"])
    return AttemptResult(delivery, posted=True)


def delivery_replay(*, delivery: WebhookDelivery, actor: Actor) -> WebhookDelivery:
    """Queue a delivery again (any state but in flight): a new attempt with the same event id and body."""
    with transaction.atomic():
        locked = WebhookDelivery.objects.select_for_update().select_related("endpoint").get(pk=delivery.pk)
        if locked.endpoint.deleted_at is not None:
            raise Conflict("the endpoint was deleted; create a new one to receive events")
        now = timezone.now()
        if locked.lease_until is not None and locked.lease_until > now:
            raise Conflict("this delivery is being posted right now")
        locked.status, locked.run_attempts, locked.next_attempt_at = DeliveryStatus.PENDING, 0, now
        locked.replays += 1
        locked.save(update_fields=["status", "run_attempts", "next_attempt_at", "replays"])
        audit_record(actor=actor, action=AuditAction.WEBHOOK_DELIVERY_REPLAY, target=locked,
                     operator=locked.endpoint.operator, data={"event": locked.event_id,
                                                              "endpoint": str(locked.endpoint_id)})
        _queue([str(locked.pk)])
    return locked


def retry_waits_in_queue(wait_s: float) -> bool:
    """Whether a retry this far off is a countdown message in the queue, or left to the sweep.

    A countdown longer than the broker's visibility timeout is handed out again by Redis every time that
    timeout passes, so hours of backoff would pile up copies of one message; long waits are the sweep's.
    """
    return wait_s <= settings.WEBHOOK_COUNTDOWN_MAX_S


def deliveries_queue_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """The sweep (beat): queue due deliveries that no queued message will bring (a long wait, or a message
    lost with the broker); a delivery queued twice is posted once."""
    now = now or timezone.now()
    grace = now - timedelta(seconds=settings.WEBHOOK_SWEEP_GRACE_S)
    overdue = Q(next_attempt_at__lte=grace)  # its countdown message should have run by now
    long_wait = Q(next_attempt_at__lte=now, last_attempt_at__isnull=False,
                  next_attempt_at__gt=F("last_attempt_at") + timedelta(seconds=settings.WEBHOOK_COUNTDOWN_MAX_S))
    due = list(WebhookDelivery.objects.filter(overdue | long_wait, status=DeliveryStatus.PENDING)
               .filter(Q(lease_until__isnull=True) | Q(lease_until__lte=now))
               .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
    from .tasks import webhook_deliver_task

    for delivery_id in due:
        webhook_deliver_task.delay(str(delivery_id))
    return len(due)
