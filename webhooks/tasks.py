"""Celery tasks for webhooks: ids in, one service call; the retry countdown comes from the row's schedule
(short waits as a countdown, long ones through the beat sweep)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from .choices import DeliveryStatus
from .runtime_events import runtime_events_detect
from .services import deliveries_queue_due, delivery_attempt, retry_waits_in_queue

__all__ = ["webhook_deliver_task", "webhooks_sweep_task"]


@shared_task(bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def webhook_deliver_task(self, delivery_id: str) -> str:
    """One attempt; while the delivery stays pending, retry when its ``next_attempt_at`` comes."""
    result = delivery_attempt(delivery_id=delivery_id)
    delivery = result.delivery
    if delivery is None or not result.posted:
        # A duplicate or early message: only the task that posted schedules the next attempt (the sweep
        # picks up a due delivery whose message was lost), so duplicates never multiply.
        return "skipped"
    if delivery.status == DeliveryStatus.PENDING and delivery.next_attempt_at is not None:
        countdown = max(0.0, (delivery.next_attempt_at - timezone.now()).total_seconds())
        if retry_waits_in_queue(countdown):
            raise self.retry(countdown=countdown)
        return "left to the sweep"  # a long wait: webhooks_sweep_task queues it when it is due
    return str(delivery.status)


@shared_task(acks_late=True)
def webhooks_sweep_task() -> int:
    """Beat: task outcomes and replies read from the instances become events (``runtime_events``; their
    deliveries are queued as they commit), then due deliveries no message will bring are queued."""
    runtime_events_detect()
    return deliveries_queue_due()
