"""Input and output shapes of the schedules API. Inputs are strict (an unknown field is a 400); what a value
means (a cron expression, a zone, a thread name) is checked by ``schedules.services``, which names the field."""

from __future__ import annotations

from typing import Any, ClassVar

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.openapi import NUL_FREE_OBJECT
from controlplane.strict import JSONBoolean, JSONInteger, JSONString, StrictInput
from conversations.services import MAX_MESSAGE_CHARS

from ..choices import CATCH_UP_MAX_DEFAULT, CATCH_UP_MAX_LIMIT, CatchUp, FireStatus, ScheduleStatus, TargetType
from ..models import Schedule, ScheduleFire
from ..selectors import schedule_next_fires


@extend_schema_field(NUL_FREE_OBJECT)
class _JSONObject(serializers.DictField):
    """A free JSON object (a task's params)."""


class TaskTarget(StrictInput):
    kind = JSONString(max_length=100, help_text="An agent kind the instance runs.")
    params = _JSONObject(required=False, default=dict)


class MessageTarget(StrictInput):
    thread = JSONString(max_length=200, help_text="1-200 characters of A-Z a-z 0-9 . _ : -")
    content = JSONString(trim_whitespace=False, help_text=f"1 to {MAX_MESSAGE_CHARS} characters.")


class _ScheduleFields(StrictInput):
    name = JSONString(max_length=100)
    cron = JSONString(max_length=100, help_text="5 fields, or 6 with seconds last, or `@daily`-style; in `timezone`.")
    timezone = JSONString(max_length=64, help_text="An IANA zone: `UTC`, `Europe/Paris`.")
    at = serializers.DateTimeField(help_text="Fire once at this moment (with its UTC offset) instead of `cron`.")
    task = TaskTarget(help_text="Submit this task at each fire.")
    message = MessageTarget(help_text="Or post this message into this thread at each fire.")
    catch_up = serializers.ChoiceField(choices=CatchUp.choices,
                                       help_text="Fire times missed while nothing could fire them: `skip` them, run "
                                                 "the `latest` once, or run `all` (the newest `catch_up_max`).")
    catch_up_max = JSONInteger(min_value=1, max_value=CATCH_UP_MAX_LIMIT)
    paused = JSONBoolean(help_text="`true` pauses (times that pass are never fired), `false` resumes.")


class ScheduleCreateInput(_ScheduleFields):
    # ``schedule_create``: exactly one of cron and at, exactly one of task and message (400 otherwise).
    schema_rules: ClassVar[dict[str, Any]] = {"allOf": [
        {"oneOf": [{"required": ["cron"]}, {"required": ["at"]}]},
        {"oneOf": [{"required": ["task"]}, {"required": ["message"]}]},
    ]}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("cron", "at", "task", "message"):
            self.fields[name].required = False
        self.fields["timezone"].required = False
        self.fields["timezone"].default = "UTC"
        self.fields["catch_up"].required, self.fields["catch_up"].default = False, CatchUp.LATEST
        self.fields["catch_up_max"].required, self.fields["catch_up_max"].default = False, CATCH_UP_MAX_DEFAULT
        self.fields["paused"].required, self.fields["paused"].default = False, False


class SchedulePatchInput(_ScheduleFields):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


class ScheduleOutput(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField()
    cron = serializers.CharField(allow_blank=True, help_text="Empty for a one-off schedule.")
    timezone = serializers.CharField()
    at = serializers.DateTimeField(allow_null=True)
    target_type = serializers.ChoiceField(choices=TargetType.choices)
    task = serializers.SerializerMethodField()
    message = serializers.SerializerMethodField()
    catch_up = serializers.ChoiceField(choices=CatchUp.choices)
    catch_up_max = serializers.IntegerField()
    status = serializers.ChoiceField(choices=ScheduleStatus.choices)
    next_fires = serializers.SerializerMethodField(help_text="The next fire times (UTC), none while paused.")
    last_fire_at = serializers.DateTimeField(allow_null=True)
    skipped_fires = serializers.IntegerField(help_text="Missed fire times the catch-up policy dropped.")
    created_by_task = serializers.CharField(allow_blank=True, help_text="The agent's task whose step made this "
                                                                       "schedule (`ctx.schedule`); empty otherwise.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    @extend_schema_field(TaskTarget(allow_null=True))
    def get_task(self, obj: Schedule) -> dict[str, Any] | None:
        return obj.target if obj.target_type == TargetType.TASK else None

    @extend_schema_field(MessageTarget(allow_null=True))
    def get_message(self, obj: Schedule) -> dict[str, Any] | None:
        return obj.target if obj.target_type == TargetType.MESSAGE else None

    @extend_schema_field(serializers.ListField(child=serializers.DateTimeField()))
    def get_next_fires(self, obj: Schedule) -> list[str]:
        field = serializers.DateTimeField()
        return [field.to_representation(t) for t in schedule_next_fires(obj)]


class FireOutput(serializers.Serializer):
    id = serializers.UUIDField()
    fire_time = serializers.DateTimeField(help_text="The scheduled time: the fire's key, with the schedule's id.")
    status = serializers.ChoiceField(choices=FireStatus.choices)
    attempts = serializers.IntegerField()
    error = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    dispatched_at = serializers.DateTimeField(allow_null=True)
    inbox_status = serializers.SerializerMethodField(help_text="The inbox item's status: `pending` while the "
                                                               "instance has not taken it.")
    task_id = serializers.SerializerMethodField(help_text="The task this fire started (for a message: the task "
                                                          "answering it, once the instance took it).")
    message_id = serializers.SerializerMethodField(help_text="The message this fire posted (message targets).")

    def get_inbox_status(self, obj: ScheduleFire) -> str | None:
        return obj.inbox_item.status if obj.inbox_item is not None else None

    def get_task_id(self, obj: ScheduleFire) -> str | None:
        item = obj.inbox_item
        if item is None:
            return None
        if obj.target_type == TargetType.TASK:
            return str(item.pk)
        task = (item.response or {}).get("task") if isinstance(item.response, dict) else None
        return str(task["id"]) if isinstance(task, dict) and task.get("id") else None

    def get_message_id(self, obj: ScheduleFire) -> str | None:
        if obj.inbox_item is None or obj.target_type != TargetType.MESSAGE:
            return None
        return str(obj.inbox_item.pk)
