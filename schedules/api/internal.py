"""``/internal/v1/schedules``: the agent's own schedules (``ctx.schedule`` in a step), for its instance token.

The instance's effect ledger makes the call once per logical step and passes the effect's key as
``Idempotency-Key``; here the key is unique per tenant (``Schedule.idempotency_key``), so a repeat of the call (a
step replayed after a kill, an in-doubt effect resolved) answers with the schedule the first call made, never a
second one; ``by-key/<key>`` is the ledger's lookup: 404 means no schedule was ever made under that key (the create
commits the key with the schedule, so "absent" is true at once). Only the token's own tenant is addressable: the
paths name no tenant. Not part of the public schema.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.errors import NotFound, ValidationFailed
from controlplane.strict import JSONString, validate_idempotency_key
from instances.identity import instance_actor
from instances.internal.views import InstanceAPIView

from ..selectors import schedule_by_key
from ..services import schedule_create
from ..sweep import fault_pause
from .serializers import ScheduleCreateInput, ScheduleOutput

# A follow-up is at most a year and a day away (as a relative time: "in three days").
MAX_IN_S = 366 * 86_400


class AgentScheduleInput(ScheduleCreateInput):
    """The public create's fields, the name optional (one is made from the key), plus ``in_s`` (fire once this
    many seconds after the schedule is made: a relative time stays the same argument on every replay) and the
    asking task."""

    in_s = serializers.IntegerField(min_value=1, max_value=MAX_IN_S, required=False)
    created_by_task = JSONString(max_length=64, required=False, default="")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["name"].required = False


def _default_name(key: str) -> str:
    return f"agent-{key[-16:]}" if key else "agent"


@extend_schema(exclude=True)
class AgentScheduleCreateView(InstanceAPIView):
    def post(self, request: Request) -> Response:
        tenant = self.instance(request).tenant
        key = validate_idempotency_key(request.headers.get("Idempotency-Key"))
        if not key:
            raise ValidationFailed("Idempotency-Key is required: the instance's effect ledger names the call")
        existing = schedule_by_key(tenant=tenant, key=key)
        if existing is not None:
            fault_pause("agent_answer")
            return Response(ScheduleOutput(existing).data, status=status.HTTP_200_OK)
        if not isinstance(request.data, dict):
            raise ValidationFailed("the body must be a JSON object")
        body = AgentScheduleInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        at = data.get("at")
        if "in_s" in data:
            if at is not None or data.get("cron"):
                raise ValidationFailed("in_s: give one of `cron`, `at` or `in_s`", extra={"field": "in_s"})
            at = timezone.now() + timedelta(seconds=data["in_s"])
        schedule = schedule_create(
            tenant=tenant, name=data.get("name") or _default_name(key), cron=data.get("cron"),
            timezone_name=data["timezone"], at=at, task=data.get("task"), message=data.get("message"),
            catch_up=data["catch_up"], catch_up_max=data["catch_up_max"], paused=data["paused"],
            actor=instance_actor(self.instance(request)), idempotency_key=key,
            created_by_task=data["created_by_task"])
        fault_pause("agent_answer")  # committed, not yet answered: where a kill leaves the instance in doubt
        return Response(ScheduleOutput(schedule).data, status=status.HTTP_201_CREATED)


@extend_schema(exclude=True)
class AgentScheduleByKeyView(InstanceAPIView):
    def get(self, request: Request, key: str) -> Response:
        schedule = schedule_by_key(tenant=self.instance(request).tenant, key=key)
        if schedule is None:
            raise NotFound("no schedule was made under this key")
        fault_pause("agent_answer")
        return Response(ScheduleOutput(schedule).data)
