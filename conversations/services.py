"""Writes: the durable inbox (message, task, cancel, retry, decision) and its delivery to the instance.

Every write is committed before the instance is called, so whatever happens to the instance (stopped,
restarting, SIGKILLed mid-call) nothing accepted is lost; delivery is retried by ``inbox_deliver`` (the
request itself, beat every few seconds, and a heartbeat of a ready instance). The instance dedupes by
the item's id, so a retry after a lost answer is harmless and nothing is answered twice.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any
from urllib.parse import quote

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from controlplane.after_response import after_response
from controlplane.errors import Conflict, MonthlyLimitReached, NotFound, QuotaExceeded, ValidationFailed
from controlplane.locks import AdvisoryLock
from controlplane.strict import free_json_validate, validate_idempotency_key
from instances.client import InstanceProblem, InstanceUnavailable, instance_client
from provisioning.fleet.sleep import (
    activity_nowait_sql,
    instance_activity,
    instance_activity_recorded,
    instance_wake_request,
)
from tenants.actors import Actor
from tenants.audit import audit_record, audit_row, audit_row_recorded
from tenants.audit_actions import AuditAction
from tenants.choices import TENANT_GONE, TenantStatus
from tenants.end_users import validate_end_user
from tenants.models import AuditLog, Plan, Tenant
from tenants.services import IdempotencyMismatch
from tenants.tokens import CredentialsChanged, Recheck
from usage.models import UsageDay

from .choices import DEFAULT_THREAD_POLICY, EffectDecision, InboxKind, InboxStatus, ThreadPolicy
from .models import InboxItem, ThreadSetting
from .monthly_limits import month_window

__all__ = ["Accepted", "ThreadBusy", "message_send", "thread_policy_set", "task_submit", "task_cancel", "task_retry",
           "effect_decide", "inbox_deliver", "validate_thread", "validate_task_id", "validate_effect_key",
           "MAX_MESSAGE_CHARS"]

THREAD_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
KIND_RE = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
# The runtime's keys are "eff-<hex>"; anything outside this alphabet cannot be one.
EFFECT_KEY_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
MAX_MESSAGE_CHARS = 32_000
MAX_PARAMS_BYTES = 64 * 1024
MAX_NOTE_CHARS = 2_000
INSTANCE_DECIDED_BY_MAX = 200  # agent_runtime.host.api refuses a longer decided_by
# No instance is meant to run (suspended on purpose, or never provisioned): items are held in the inbox, not
# offered to whatever still answers on the old port; resume (or the first ready heartbeat) delivers them.
HELD_TENANT = (TenantStatus.SUSPENDED, TenantStatus.PENDING, TenantStatus.PROVISIONING, TenantStatus.FAILED)
# A request waits this long for another delivery of the same tenant to finish before answering 202.
_DELIVERY_LOCK_WAIT_S = 2.0


@dataclass(frozen=True)
class Accepted:
    """What a write returns: the inbox item, whether it is new, and whether the instance has it."""

    item: InboxItem
    created: bool

    @property
    def delivered(self) -> bool:
        return self.item.status == InboxStatus.DELIVERED


def validate_thread(thread: object) -> str:
    if not isinstance(thread, str) or not THREAD_RE.fullmatch(thread):
        raise ValidationFailed("thread must be 1-200 characters of A-Z a-z 0-9 . _ : -")
    return thread


def validate_task_id(task_id: object) -> str:
    try:
        return str(uuid.UUID(str(task_id)))
    except ValueError:
        raise NotFound("task not found") from None


def validate_effect_key(key: object) -> str:
    if not isinstance(key, str) or not EFFECT_KEY_RE.fullmatch(key):
        raise NotFound("effect not found")
    return key


def _validate_content(content: object) -> str:
    if not isinstance(content, str) or not content.strip():
        raise ValidationFailed("content must be a non-empty string")
    if len(content) > MAX_MESSAGE_CHARS:
        raise ValidationFailed(f"content must be at most {MAX_MESSAGE_CHARS} characters")
    if "\x00" in content:
        raise ValidationFailed("content must not contain NUL characters")
    return content


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# The plan's daily quota that each kind of item counts against (cancels and decisions are never limited). The
# same kinds count against the plan's monthly limits (``_MONTHLY``): a message is a task of the agent's too.
_QUOTA_FIELD: dict[str, str] = {InboxKind.MESSAGE: "max_messages_per_day", InboxKind.TASK: "max_tasks_per_day"}
_MONTHLY_TASKS, _MONTHLY_TOKENS = "max_tasks_per_month", "max_tokens_per_month"


@dataclass(frozen=True)
class _Limits:
    """What the insert's statement read of the plan: the daily limit of the item's kind, the monthly limits, and
    the month's tokens (read only when that limit is set)."""

    daily: int | None = None
    month_tasks: int | None = None
    month_tokens: int | None = None
    tokens_used: int | None = None


def _insert_values(obj: Any, wrap: dict[str, str] | None = None) -> tuple[str, list[Any]]:
    """``INSERT INTO ... VALUES`` of an unsaved model instance, as the ORM's insert builds it (each field's
    ``pre_save`` and database value), its auto primary key left to the database. ``wrap``: a field's value as an
    SQL expression around its placeholder (``%s``), e.g. a JSON object completed from another table."""
    meta = obj._meta
    qn = connection.ops.quote_name
    fields = [f for f in meta.concrete_fields if f is not getattr(meta, "auto_field", None)]
    values = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    cols = ", ".join(qn(f.column) for f in fields)
    marks = ", ".join((wrap or {}).get(f.name, "%s") for f in fields)
    return f"INSERT INTO {qn(meta.db_table)} ({cols}) VALUES ({marks})", values  # noqa: S608 - names only


def _insert_with_audit(*, tenant: Tenant, kind: str, item: InboxItem, audit: AuditLog, month_start: datetime,
                       thread_policy_of: str | None = None, activity: bool = False, recheck: Recheck | None = None,
                       ) -> tuple[_Limits, bool, str | None, tuple[Any, str] | None, bool]:
    """Insert ``item`` and its audit row and read (the plan's limits for ``kind``, whether an older item of the
    tenant is still pending), all in one statement inside the caller's transaction (issue 39: four ORM round
    trips were most of a message's cost). The month's collected tokens are summed in the same statement, and only
    when the plan has a token limit (a ``CASE``: no limit, no read). A used Idempotency-Key fails it with
    IntegrityError.

    ``thread_policy_of``: a message that names no policy takes its thread's, read by this statement too (it was a
    statement of its own): the item's payload and the audit row's data get it, and it is returned (else None).

    ``activity``: the instance's activity is recorded by this statement too (``activity_nowait_sql``, never waiting
    for the instance's row; it was a round trip of its own), and its row returned for
    ``instance_activity_recorded`` (None: no row taken). Rolled back with the rest when the item is refused.

    ``recheck``: what a cached authentication took for granted, confirmed by this statement too (the last value
    returned: False when it no longer holds, and the caller undoes the insert)."""
    wrap_item: dict[str, str] = {}
    wrap_audit: dict[str, str] = {}
    policy_params: list[Any] = []
    policy_sql = "NULL"
    if thread_policy_of is not None:
        completed = "jsonb_set(%s::jsonb, '{policy}', to_jsonb((SELECT policy FROM thread_policy)))"
        wrap_item, wrap_audit = {"payload": completed}, {"data": completed}
        policy_sql = "(SELECT policy FROM thread_policy)"
        policy_params = [tenant.pk, thread_policy_of, str(DEFAULT_THREAD_POLICY)]
    item_sql, item_params = _insert_values(item, wrap_item)
    audit_sql, audit_params = _insert_values(audit, wrap_audit)
    field = _QUOTA_FIELD.get(kind)
    limits_sql, limits_params = "NULL, NULL, NULL, NULL", []
    if field is not None:
        col = Plan._meta.get_field
        tokens = UsageDay._meta.db_table
        limits_sql = (f'plan."{col(field).column}", plan."{col(_MONTHLY_TASKS).column}", '  # noqa: S608
                      f'plan."{col(_MONTHLY_TOKENS).column}", CASE WHEN plan."{col(_MONTHLY_TOKENS).column}" IS NULL '
                      f"THEN NULL ELSE (SELECT coalesce(sum(input_tokens + output_tokens), 0) FROM {tokens} "
                      "WHERE tenant_id = %s AND day >= %s) END")
        limits_params = [tenant.pk, month_start.date()]
    plan_join = f"LEFT JOIN {Plan._meta.db_table} plan ON plan.slug = %s" if field is not None else ""
    policy_cte = (f"thread_policy AS (SELECT coalesce((SELECT policy FROM {ThreadSetting._meta.db_table} "  # noqa: S608
                  "WHERE tenant_id = %s AND thread = %s), %s) AS policy), " if thread_policy_of is not None else "")
    activity_params: list[Any] = []
    activity_cte, activity_sql = "", "NULL, NULL"
    if activity:
        statement, activity_params = activity_nowait_sql(tenant=tenant)
        activity_cte = f", activity AS ({statement})"
        activity_sql = "(SELECT id FROM activity), (SELECT status FROM activity)"
    recheck_sql, recheck_params = recheck.condition() if recheck is not None else ("TRUE", [])
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {policy_cte}item AS ({item_sql}), audit AS ({audit_sql} RETURNING id){activity_cte} "  # noqa: S608
                       f"SELECT (SELECT id FROM audit), {limits_sql}, EXISTS (SELECT 1 FROM "
                       f"{InboxItem._meta.db_table} WHERE tenant_id = %s AND status = %s AND created_at < %s), "
                       f"{policy_sql}, {activity_sql}, {recheck_sql} FROM (SELECT 1) one {plan_join}",
                       [*policy_params, *item_params, *audit_params, *activity_params, *limits_params, tenant.pk,
                        str(InboxStatus.PENDING), item.created_at, *recheck_params,
                        *([tenant.plan_id] if field is not None else [])])
        (audit_id, daily, month_tasks, month_tokens, tokens_used, older, policy, instance_id, status,
         holds) = cursor.fetchone()
    for obj in (item, audit):
        obj._state.adding, obj._state.db = False, connection.alias
    audit.pk = audit_id
    if policy is not None:  # what the statement stored, in memory too (the delivery and the audit's receivers)
        item.payload = {**item.payload, "policy": policy}
        audit.data = {**audit.data, "policy": policy}
    row = (instance_id, status) if instance_id is not None else None
    return _Limits(daily, month_tasks, month_tokens, tokens_used), bool(older), policy, row, bool(holds)


def _refused_for_the_month(*, tenant: Tenant, field: str, limit: int, used: int, resets_at: datetime,
                           now: datetime) -> MonthlyLimitReached:
    what = "tasks (messages included)" if field == _MONTHLY_TASKS else "model tokens (input and output)"
    return MonthlyLimitReached(
        f"{field}: plan {tenant.plan_id!r} allows {limit} {what} a month (UTC); this tenant has used {used} this "
        f"month; the limit resets at {resets_at.isoformat()}. Tasks already running are not stopped.",
        extra={"limit": field, "limit_value": limit, "used": used, "plan": tenant.plan_id,
               "resets_at": resets_at.isoformat()},
        retry_after_s=max(1, int((resets_at - now).total_seconds())))


def _check_quotas(*, tenant: Tenant, kind: str, limits: _Limits, month: tuple[datetime, datetime]) -> None:
    """Inside the transaction that inserted the item: over a plan's limit, the insert is undone (429).

    Tokens were read by the insert's statement (collected usage, so it can overshoot by one collection's work);
    the daily and monthly counts of items are taken from the inbox (every message and task passes through it),
    with the tenant row locked so concurrent sends cannot both take the last slot, in one query for both.
    Retries of an accepted key never get here (their insert fails first), so a retry is answered, not refused.
    """
    now = timezone.now()
    month_start, resets_at = month
    if limits.month_tokens is not None and (limits.tokens_used or 0) >= limits.month_tokens:
        raise _refused_for_the_month(tenant=tenant, field=_MONTHLY_TOKENS, limit=limits.month_tokens,
                                     used=limits.tokens_used or 0, resets_at=resets_at, now=now)
    if limits.daily is None and limits.month_tasks is None:
        return
    Tenant.objects.select_for_update().filter(pk=tenant.pk).exists()
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    counts: dict[str, Any] = {}
    if limits.daily is not None:
        counts["day"] = Count("pk", filter=Q(kind=kind, created_at__gte=day))
    if limits.month_tasks is not None:
        counts["month"] = Count("pk", filter=Q(kind__in=list(_QUOTA_FIELD)))
    since = month_start if limits.month_tasks is not None else day
    used = InboxItem.objects.filter(tenant=tenant, created_at__gte=since).aggregate(**counts)
    if limits.daily is not None and used["day"] > limits.daily:
        raise QuotaExceeded(f"plan {tenant.plan_id!r} allows {limits.daily} {kind}s a day (UTC); this tenant has "
                            "used them all today", extra={"limit": limits.daily, "plan": tenant.plan_id})
    if limits.month_tasks is not None and used["month"] > limits.month_tasks:
        raise _refused_for_the_month(tenant=tenant, field=_MONTHLY_TASKS, limit=limits.month_tasks,
                                     used=used["month"] - 1, resets_at=resets_at, now=now)


def _accept(*, tenant: Tenant, kind: str, thread: str, payload: dict[str, Any], idempotency_key: str | None,
            actor: Actor, action: AuditAction, audit_data: dict[str, Any],
            as_requested: dict[str, Any] | None = None, deliver: bool = True,
            end_user: str | None = None, thread_policy_of: str | None = None,
            settle_after_response: bool = False, recheck: Recheck | None = None) -> Accepted:
    """Write the item (or find the one this key already wrote) and commit; then try to deliver.

    `as_requested`: what the Idempotency-Key fingerprint covers when the payload also holds something the
    request did not say (a message's policy taken from its thread, which may change between a request and its
    retry); by default the payload. `deliver=False`: the caller delivers later, several items at once
    (`inbox_deliver`: the schedules sweep); an asleep instance is still asked to wake. `end_user`: the end user
    of the tenant a message or task acts for (recorded on the item, never sent to the instance; the connections
    delivery reads it by the task's id). `thread_policy_of`: a message's thread whose policy the insert reads and
    stores (``_insert_with_audit``); `reject` undoes the insert and raises ``_ThreadRejects`` (it must be decided
    before anything is written). `settle_after_response`: the caller answers at once from the returned item and
    nothing it does later reads the item's row, so its settle may wait for the answer to be sent
    (``_deliver_one``). `recheck`: the caller's credentials came from a cache (``tenants.tokens.Recheck``); the
    insert's statement confirms them, and when they no longer hold nothing is written and ``CredentialsChanged``
    is raised for the caller to authenticate again."""
    if tenant.status in TENANT_GONE:
        raise Conflict("the tenant is being deprovisioned")
    key = validate_idempotency_key(idempotency_key)
    requested = payload if as_requested is None else as_requested
    # Without an end user the fingerprint is the one items had before end users existed.
    fingerprint = (_fingerprint(kind, thread, requested) if end_user is None
                   else _fingerprint(kind, thread, requested, end_user))
    created, older_pending = False, True
    asleep: bool | None = None  # None: the instance's activity is not recorded yet (see below)
    try:
        # One transaction before the instance is called: the item and its audit row in one statement (insert
        # first: a new key is the common case, a retried one costs a rolled-back insert), its quota, the
        # audit's receivers (webhooks' events, in this transaction as always) and the instance's activity.
        with transaction.atomic():
            item = InboxItem(tenant=tenant, kind=kind, thread=thread, payload=payload, idempotency_key=key,
                             request_fingerprint=fingerprint, end_user=end_user)
            audit = audit_row(actor=actor, action=action, target=item, tenant=tenant,
                              data={"item": str(item.id), **audit_data,
                                    **({"end_user": end_user} if end_user is not None else {})})
            month = month_window()
            active = tenant.status not in HELD_TENANT
            limits, older_pending, stored_policy, instance_row, holds = _insert_with_audit(
                tenant=tenant, kind=kind, item=item, audit=audit, month_start=month[0],
                thread_policy_of=thread_policy_of, activity=active, recheck=recheck)
            if not holds:
                raise CredentialsChanged  # rolls the insert back, and the activity with it
            if stored_policy == ThreadPolicy.REJECT:
                raise _ThreadRejects  # rolls the insert back, and the activity with it
            _check_quotas(tenant=tenant, kind=kind, limits=limits, month=month)
            audit_row_recorded(audit, tenant)
            if active:
                asleep = instance_activity_recorded(tenant=tenant, row=instance_row, trigger=kind,
                                                    accepted_at=item.created_at)
        created = True
    except IntegrityError:  # this key was used before (or concurrently): that request's row is the answer
        if key is None:
            raise
        if recheck is not None and not recheck.holds():
            raise CredentialsChanged from None
        item = InboxItem.objects.get(tenant=tenant, kind=kind, idempotency_key=key)
    if item.request_fingerprint != fingerprint:
        raise IdempotencyMismatch("this Idempotency-Key was already used with a different body")
    if item.status == InboxStatus.PENDING and tenant.status not in HELD_TENANT:
        if asleep is None:  # a retried key, or the instance's row was locked: its own transaction, waiting
            asleep = instance_activity(tenant=tenant, trigger=kind, accepted_at=item.created_at)
        if asleep:
            # Asleep (scale to zero): a worker boots it and delivers after its read-back; the caller gets 202.
            return Accepted(item=item, created=created)
        if not deliver:
            return Accepted(item=item, created=created)
        if created and not older_pending:
            # Nothing of this tenant waits before it, so delivering it now keeps the order; no lock, no re-read.
            _deliver_one(item, settle_after_response=settle_after_response)
        else:
            inbox_deliver(tenant=tenant, wait_s=_DELIVERY_LOCK_WAIT_S)
            item.refresh_from_db()
    return Accepted(item=item, created=created)


class _ThreadRejects(Exception):  # noqa: N818 - a signal between two functions here, not an error
    """The thread's stored policy, read by the insert, is `reject`: decided before the inbox (``message_send``)."""


class ThreadBusy(Conflict):
    """`reject`: the thread's previous run is still going (decided here, before the inbox, when it can be)."""

    title = "Thread busy"
    type_slug = "thread-busy"

    def __init__(self, task: dict[str, Any]) -> None:
        super().__init__(f"task {task['id']} of this thread is still {task['status']}: the thread's policy is "
                         "reject", extra={"code": "thread_busy", "task": task})


def _validate_policy(policy: object) -> str:
    if policy not in ThreadPolicy.values:
        raise ValidationFailed(f"policy must be one of: {', '.join(ThreadPolicy.values)}")
    return str(policy)


def thread_policy(*, tenant: Tenant, thread: str) -> str:
    """The thread's stored policy, else the default (`enqueue`, what every message did before policies)."""
    # One parameterised statement rather than the ORM's query (issue 39: building it cost more CPU than the read).
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT policy FROM {ThreadSetting._meta.db_table} "  # noqa: S608 - the model's table name
                       "WHERE tenant_id = %s AND thread = %s", [tenant.pk, thread])
        row = cursor.fetchone()
    return (row[0] if row else None) or DEFAULT_THREAD_POLICY


def thread_policy_set(*, tenant: Tenant, thread: str, policy: str, actor: Actor) -> ThreadSetting:
    """Store the policy of `thread` (it may have no message yet); audited with the previous one."""
    if tenant.status in TENANT_GONE:
        raise NotFound("tenant not found")
    thread = validate_thread(thread)
    policy = _validate_policy(policy)
    with transaction.atomic():
        setting, _ = ThreadSetting.objects.select_for_update().get_or_create(tenant=tenant, thread=thread)
        before = setting.policy  # a new row has the default
        setting.policy = policy
        setting.save(update_fields=["policy", "updated_at"])
        audit_record(actor=actor, action=AuditAction.CONVERSATION_THREAD_POLICY_SET, target=setting, tenant=tenant,
                     data={"thread": thread, "policy": policy, "before": before})
    return setting


def _refuse_if_busy(*, tenant: Tenant, thread: str, key: str | None) -> None:
    """`reject`, before anything is written: a message of this thread still in the inbox, or a run the instance
    says is going, refuses the new one (409 naming it). The instance decides again when the message reaches it
    (`agent_runtime.state.threads.admit`), which settles a race between two senders, and decides alone while it
    cannot be asked (down or asleep: the message waits in the inbox and may be refused at delivery)."""
    if key is not None and InboxItem.objects.filter(tenant=tenant, kind=InboxKind.MESSAGE,
                                                    idempotency_key=key).exists():
        return  # a retry of a message already taken: its answer is the one kept, not a refusal by its own run
    queued = (InboxItem.objects.filter(tenant=tenant, kind=InboxKind.MESSAGE, thread=thread,
                                       status=InboxStatus.PENDING).order_by("created_at", "id").first())
    if queued is not None:
        raise ThreadBusy({"id": str(queued.id), "status": "queued"})
    if tenant.status in HELD_TENANT:
        return
    try:
        _, answer = instance_client(tenant).request_json("GET", f"/v1/threads/{thread}/run")
    except (InstanceUnavailable, InstanceProblem):
        return  # cannot ask now (or an instance from before policies): the instance's own check decides
    running = answer.get("task")
    if isinstance(running, dict) and running.get("id"):
        raise ThreadBusy({"id": str(running["id"]), "status": str(running.get("status", "running"))})


def message_send(*, tenant: Tenant, thread: str, content: str, idempotency_key: str | None,
                 actor: Actor, policy: str | None = None, deliver: bool = True,
                 end_user: str | None = None, settle_after_response: bool = False,
                 recheck: Recheck | None = None) -> Accepted:
    """Send a message. `policy` (else the thread's, else `enqueue`) says what it does to the thread's run that
    is still going: reject, enqueue, interrupt or rollback (docs/conversations.md). `deliver=False`: accepted
    only; the caller delivers (`inbox_deliver`). `end_user`: the end user of the tenant the message (and the task
    answering it) acts for: whose connected accounts that task may use (docs/connections.md).
    `settle_after_response`: for a caller that answers at once from the returned item (the API's views; not one
    that waits for the task within its request), see ``_accept``; `recheck` too."""
    end_user = validate_end_user(end_user)
    thread = validate_thread(thread)
    content = _validate_content(content)
    if policy is not None:
        policy = _validate_policy(policy)

    def accept(effective: str, *, of_thread: bool = False) -> Accepted:
        return _accept(tenant=tenant, kind=InboxKind.MESSAGE, thread=thread,
                       payload={"content": content, "policy": effective},
                       # Without a policy the fingerprint is the one messages had before policies existed.
                       as_requested={"content": content} if policy is None else {"content": content, "policy": policy},
                       idempotency_key=idempotency_key, actor=actor, action=AuditAction.CONVERSATION_MESSAGE_SEND,
                       audit_data={"thread": thread, "chars": len(content), "policy": effective}, deliver=deliver,
                       end_user=end_user, thread_policy_of=thread if of_thread else None,
                       settle_after_response=settle_after_response, recheck=recheck)

    effective = policy
    if effective is None:
        # The thread's policy is read by the insert (issue 39: one statement fewer); only `reject`, which must be
        # decided before anything is written, undoes that insert and takes the path below.
        try:
            return accept(DEFAULT_THREAD_POLICY, of_thread=True)
        except _ThreadRejects:
            effective = ThreadPolicy.REJECT
    if effective == ThreadPolicy.REJECT:
        _refuse_if_busy(tenant=tenant, thread=thread, key=validate_idempotency_key(idempotency_key))
    return accept(effective)


def task_submit(*, tenant: Tenant, kind: str, params: dict[str, Any], idempotency_key: str | None,
                actor: Actor, deliver: bool = True, end_user: str | None = None,
                settle_after_response: bool = False, recheck: Recheck | None = None) -> Accepted:
    """Submit a task. `end_user`: the end user of the tenant it acts for (whose connected accounts its steps may
    use, docs/connections.md); None: the tenant as a whole. `settle_after_response`, `recheck`: as for
    ``message_send``."""
    end_user = validate_end_user(end_user)
    if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
        raise ValidationFailed("kind must be 1-100 characters of A-Z a-z 0-9 . _ -")
    if not isinstance(params, dict):
        raise ValidationFailed("params must be a JSON object")
    if len(json.dumps(params)) > MAX_PARAMS_BYTES:
        raise ValidationFailed(f"params must be at most {MAX_PARAMS_BYTES} bytes of JSON")
    free_json_validate(params, "params")
    return _accept(tenant=tenant, kind=InboxKind.TASK, thread="", payload={"kind": kind, "params": params},
                   idempotency_key=idempotency_key, actor=actor, action=AuditAction.TASK_SUBMIT,
                   audit_data={"kind": kind}, deliver=deliver, end_user=end_user,
                   settle_after_response=settle_after_response, recheck=recheck)


def task_cancel(*, tenant: Tenant, task_id: str, actor: Actor, idempotency_key: str | None = None) -> Accepted:
    task_id = validate_task_id(task_id)
    return _accept(tenant=tenant, kind=InboxKind.CANCEL, thread="", payload={"task": task_id},
                   idempotency_key=idempotency_key, actor=actor, action=AuditAction.TASK_CANCEL,
                   audit_data={"task": task_id})


def task_retry(*, tenant: Tenant, task_id: str, actor: Actor, idempotency_key: str | None = None) -> Accepted:
    """Run a blocked or failed (poison) task again from its last checkpoint, after its cause was fixed.

    Through the inbox like a cancel: audited, durable while the instance restarts or sleeps (a sleeping one is
    woken). The instance answers 409 for a task in any other state; steps already done are not run again and
    committed effects are not repeated (the checkpoint and the effect ledger see to it)."""
    task_id = validate_task_id(task_id)
    return _accept(tenant=tenant, kind=InboxKind.RETRY, thread="", payload={"task": task_id},
                   idempotency_key=idempotency_key, actor=actor, action=AuditAction.TASK_RETRY,
                   audit_data={"task": task_id})


def effect_decide(*, tenant: Tenant, effect_key: str, decision: str, result: dict[str, Any] | None,
                  note: str, actor: Actor, idempotency_key: str | None = None) -> Accepted:
    effect_key = validate_effect_key(effect_key)
    if decision not in EffectDecision.values:
        raise ValidationFailed(f"decision must be one of: {', '.join(EffectDecision.values)}")
    if result is not None and not isinstance(result, dict):
        raise ValidationFailed("result must be a JSON object")
    if len(json.dumps(result or {})) > MAX_PARAMS_BYTES:
        raise ValidationFailed(f"result must be at most {MAX_PARAMS_BYTES} bytes of JSON")
    free_json_validate(result, "result")
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise ValidationFailed(f"note must be at most {MAX_NOTE_CHARS} characters")
    payload = {"effect": effect_key, "decision": decision, "result": result or {}, "note": note,
               "decided_by": actor.label}
    return _accept(tenant=tenant, kind=InboxKind.DECISION, thread="", payload=payload,
                   idempotency_key=idempotency_key, actor=actor, action=AuditAction.EFFECT_DECIDE,
                   audit_data={"effect": effect_key, "decision": decision})


def _request_for(item: InboxItem) -> tuple[str, dict[str, Any] | None]:
    p = item.payload
    if item.kind == InboxKind.MESSAGE:
        body = {"id": str(item.id), "content": p["content"]}
        # `enqueue` is what an instance without policies does: not sent, so such an instance still takes it.
        if p.get("policy", DEFAULT_THREAD_POLICY) != DEFAULT_THREAD_POLICY:
            body["policy"] = p["policy"]
        return f"/v1/threads/{item.thread}/messages", body
    if item.kind == InboxKind.TASK:
        return "/v1/tasks", {"id": str(item.id), "kind": p["kind"], "params": p["params"]}
    if item.kind == InboxKind.CANCEL:
        return f"/v1/tasks/{p['task']}/cancel", None
    if item.kind == InboxKind.RETRY:
        return f"/v1/tasks/{p['task']}/retry", None
    # The instance takes at most 200 characters of "who" (docs/instance-api.md; its ledger keeps 100): a long
    # note is cut there, never refused (a 400 schemathesis found with a 2,000-character note). The whole note
    # stays in this inbox item's payload.
    decided_by = p["decided_by"] + (f" ({p['note']})" if p.get("note") else "")
    return (f"/v1/effects/{quote(p['effect'], safe='')}/decision",
            {"decision": p["decision"], "result": p["result"], "decided_by": decided_by[:INSTANCE_DECIDED_BY_MAX]})


def _settle(item: InboxItem, changes: dict[str, Any]) -> bool:
    """Record the instance's answer on ``item`` if it is still pending; whether this call did. One parameterised
    UPDATE (the ORM's cost more CPU to build than the round trip, issue 39).

    Outside a transaction it commits with ``synchronous_commit`` off, for this statement only: a settle lost to a
    database crash leaves the item pending, and pending is redelivered (``inbox_deliver``) to an instance that
    de-duplicates by the item's id (the message's task is looked up by it, a thread's policy is not applied twice:
    ``agent_runtime.state.threads.admit``), answering what it answered the first time. The caller already had that
    answer, so nothing is lost or done twice (docs/conversations.md, "What a message costs";
    test_conversations_e2e covers the redelivery). Inside a caller's transaction the setting would cover the
    caller's writes too, so there it commits as usual."""
    meta = InboxItem._meta
    qn = connection.ops.quote_name
    values = {"attempts": item.attempts, **changes}
    fields = [meta.get_field(name) for name in values]
    sets = ", ".join(f"{qn(f.column)} = %s" for f in fields)
    params = [f.get_db_prep_save(v, connection) for f, v in zip(fields, values.values(), strict=True)]
    unsynced = "" if connection.in_atomic_block else (
        ", (SELECT set_config('synchronous_commit', 'off', true)) AS commit_unsynced")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {qn(meta.db_table)} SET {sets} "  # noqa: S608 - the model's names only
                       f"FROM (SELECT 1) AS one{unsynced} WHERE {qn(meta.pk.column)} = %s AND status = %s",
                       [*params, item.pk, str(InboxStatus.PENDING)])
        return cursor.rowcount > 0


def _deliver_one(item: InboxItem, *, settle_after_response: bool = False) -> bool:
    """Deliver one item; False when the instance is unavailable (the item stays pending). `item` is updated in
    memory too, so the caller needs no re-read.

    ``settle_after_response``: the settle runs once the request's answer has been sent
    (``controlplane.after_response``; at once outside a request or inside a caller's transaction), about 1 ms off a
    message's hop (issue 39). Nothing waits for it: the answer is built from ``item`` in memory, and an item left
    pending (the settle lost, or not yet run when the tenant's next message checks for older pending items) is
    redelivered to an instance that de-duplicates by its id, as ``_settle`` says. Only the lock-free path of
    ``_accept`` takes it: ``inbox_deliver`` settles each item before the next one, under its lock."""
    path, body = _request_for(item)
    client = instance_client(item.tenant)
    item.attempts += 1
    try:
        status, answer = client.request_json("POST", path, body)
    except InstanceUnavailable as exc:
        item.last_error = exc.detail[:500]
        InboxItem.objects.filter(pk=item.pk, status=InboxStatus.PENDING).update(
            attempts=item.attempts, last_error=item.last_error)
        return False
    except InstanceProblem as problem:
        changes = {"status": InboxStatus.REFUSED, "last_error": problem.detail[:500], "response": problem.as_problem(),
                   "response_status": problem.status_code, "delivered_at": timezone.now()}
    else:
        changes = {"status": InboxStatus.DELIVERED, "last_error": "", "response": answer, "response_status": status,
                   "delivered_at": timezone.now()}
    if settle_after_response and not connection.in_atomic_block:
        after_response(partial(_settle, item, dict(changes)))
        for field, value in changes.items():
            setattr(item, field, value)
    elif _settle(item, changes):
        for field, value in changes.items():
            setattr(item, field, value)
    else:  # another deliverer settled it first (the instance deduped by id): its answer is the one kept
        item.refresh_from_db()
    return True


def inbox_deliver(*, tenant: Tenant, wait_s: float = 0.0, limit: int = 500) -> int:
    """Deliver ``tenant``'s pending items oldest first; stop at the first one the instance cannot take.

    One deliverer per tenant at a time (an advisory lock), so the instance sees items in order. Returns
    the number of items settled (delivered or refused). Idempotent.
    """
    if tenant.status in HELD_TENANT:
        return 0
    if instance_wake_request(tenant=tenant, trigger="delivery"):
        return 0  # asleep: the wake delivers once the instance is up (one wake however many ask)
    deadline = time.monotonic() + wait_s
    while True:
        with AdvisoryLock(f"conversations.inbox:{tenant.pk}") as lock:
            if lock.held:
                settled = 0
                items = list(InboxItem.objects.filter(tenant=tenant, status=InboxStatus.PENDING)
                             .select_related("tenant").order_by("created_at", "id")[:limit])
                for item in items:
                    if not _deliver_one(item):
                        break
                    settled += 1
                return settled
        if time.monotonic() >= deadline:
            return 0
        time.sleep(0.05)
