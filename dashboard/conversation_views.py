"""Staff pages for a tenant's agent: chat, tasks, one task, the log; and the queue of effects in doubt.

Viewing needs ``is_staff`` (as every dashboard page); sending a message needs
``dashboard.talk_to_agent`` and deciding an effect ``dashboard.decide_effect`` (see ``models.py``).
A decision is audited by ``conversations.services.effect_decide`` and waits in the durable inbox when
the instance is down.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.errors import ApplicationError, NotFound
from conversations import screens
from conversations.choices import EffectDecision, InboxStatus
from conversations.selectors import effect_list
from conversations.services import effect_decide, validate_effect_key
from instances.client import InstanceProblem, InstanceUnavailable
from tenants.models import Tenant

from .effect_queue import effect_queue, effect_queue_deadline_s
from .views import _actor, _tenant, staff_required

TALK = "dashboard.talk_to_agent"
DECIDE = "dashboard.decide_effect"
DECISIONS = [
    (EffectDecision.PERFORMED, "It happened",
     "The provider did it (checked by hand). The effect is committed with the result below and the task continues "
     "as if the call had returned it."),
    (EffectDecision.NOT_PERFORMED, "It did not happen, and must not",
     "The effect is settled as failed and the task is blocked for its owner to cancel or fix."),
    (EffectDecision.PERFORM_NOW, "It did not happen: do it now",
     "The effect goes back to intent and the step performs it with the same idempotency key."),
]


def _reply_url(tenant: Tenant, thread: str):
    return lambda message_id: reverse("dashboard:chat-reply", args=[tenant.pk, thread, message_id])


def chat_panel(request: HttpRequest, tenant: Tenant) -> dict[str, Any] | None:
    """The chat panel's context on the tenant page (None when the tenant has no agent to talk to)."""
    if tenant.status not in screens.CHAT_STATUSES:
        return None
    thread = screens.thread_from(request)
    return screens.chat_context(tenant=tenant, thread=thread,
                                send_url=reverse("dashboard:chat-send", args=[tenant.pk, thread]),
                                reply_url=_reply_url(tenant, thread), can_send=request.user.has_perm(TALK))


def _decide_url(tenant: Tenant, effect: dict[str, Any], back: str) -> str:
    return reverse("dashboard:effect-decide", args=[tenant.pk, effect.get("key", "")]) + "?" + urlencode(
        {"next": back})


@require_POST
@staff_required
def chat_send(request: HttpRequest, tenant_id: uuid.UUID, thread: str) -> HttpResponse:
    if not request.user.has_perm(TALK):
        raise PermissionDenied(f"needs {TALK}")
    tenant = _tenant(tenant_id)
    back = reverse("dashboard:tenant", args=[tenant.pk]) + (
        "?" + urlencode({"thread": thread}) if thread != screens.DEFAULT_THREAD else "") + "#chat"
    return screens.message_post(request, tenant=tenant, thread=thread, actor=_actor(request),
                                key_prefix=f"dashboard:{request.user.pk}", reply_url=_reply_url(tenant, thread),
                                back_url=back)


@require_GET
@staff_required
def chat_reply(request: HttpRequest, tenant_id: uuid.UUID, thread: str, message_id: str) -> HttpResponse:
    return screens.reply_stream(tenant=_tenant(tenant_id), thread=thread, message_id=message_id)


@require_GET
@staff_required
def tasks(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _tenant(tenant_id)
    ctx = screens.tasks_context(request, tenant=tenant,
                                task_url=lambda task_id: reverse("dashboard:task", args=[tenant.pk, task_id]))
    return render(request, "dashboard/tasks.html", {**ctx, "tenant": tenant, "nav": "tenants"})


@require_GET
@staff_required
def task(request: HttpRequest, tenant_id: uuid.UUID, task_id: str) -> HttpResponse:
    tenant = _tenant(tenant_id)
    can_decide = request.user.has_perm(DECIDE)
    back = request.get_full_path()
    ctx = screens.task_context(tenant=tenant, task_id=task_id,
                               decide_url=(lambda e: _decide_url(tenant, e, back)) if can_decide else None,
                               retry_url=reverse("dashboard:task-retry", args=[tenant.pk, task_id])
                               if can_decide else None,
                               cancel_url=reverse("dashboard:task-cancel", args=[tenant.pk, task_id])
                               if can_decide else None)
    return render(request, "dashboard/task.html", {**ctx, "tenant": tenant, "can_decide": can_decide,
                                                   "nav": "tenants"})


@require_POST
@staff_required
def task_retry(request: HttpRequest, tenant_id: uuid.UUID, task_id: str) -> HttpResponse:
    """Retry a stuck task. The same permission as deciding an effect: both are the human lever on a stuck task
    (a separate one would need a permission migration in this app for no difference in who holds it)."""
    if not request.user.has_perm(DECIDE):
        raise PermissionDenied(f"needs {DECIDE}")
    tenant = _tenant(tenant_id)
    return screens.task_retry_post(request, tenant=tenant, task_id=task_id, actor=_actor(request),
                                   key_prefix=f"dashboard:{request.user.pk}",
                                   back_url=reverse("dashboard:task", args=[tenant.pk, task_id]))


@require_http_methods(["GET", "POST"])
@staff_required
def task_cancel(request: HttpRequest, tenant_id: uuid.UUID, task_id: str) -> HttpResponse:
    """Cancel a task: the same permission as Retry (see ``task_retry``), behind a confirm page (cancelling cannot
    be undone); only the confirm page's POST cancels."""
    if not request.user.has_perm(DECIDE):
        raise PermissionDenied(f"needs {DECIDE}")
    tenant = _tenant(tenant_id)
    back_url = reverse("dashboard:task", args=[tenant.pk, task_id])
    if screens.task_cancel_confirmed(request):
        return screens.task_cancel_post(request, tenant=tenant, task_id=task_id, actor=_actor(request),
                                        key_prefix=f"dashboard:{request.user.pk}", back_url=back_url)
    ctx = screens.task_cancel_confirm_context(tenant=tenant, task_id=task_id, back_url=back_url,
                                              cancel_url=reverse("dashboard:task-cancel", args=[tenant.pk, task_id]))
    return render(request, "dashboard/task_cancel.html", {**ctx, "tenant": tenant, "nav": "tenants"})


@require_GET
@staff_required
def logs(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    """The log screen, or (with ``since``) the follow poll's rows."""
    tenant = _tenant(tenant_id)
    ctx = screens.logs_context(request, tenant=tenant, logs_url=reverse("dashboard:logs", args=[tenant.pk]),
                               task_url=lambda task_id: reverse("dashboard:task", args=[tenant.pk, task_id]))
    if ctx["partial"]:
        return render(request, "ui/agent/_log_follow.html", ctx)
    return render(request, "dashboard/logs.html", {**ctx, "tenant": tenant, "nav": "tenants"})


@require_GET
@staff_required
def effects(request: HttpRequest) -> HttpResponse:
    try:
        page = max(1, int(request.GET.get("page", "1")))
    except ValueError:
        page = 1
    deadline_s = effect_queue_deadline_s()
    queue = effect_queue(page=page, deadline_s=deadline_s)
    can_decide = request.user.has_perm(DECIDE)
    back = request.get_full_path()
    for row in queue.rows:
        row["decide_url"] = _decide_url(row["tenant"], row["effect"], back) if can_decide else ""
    return render(request, "dashboard/effects.html", {"q": queue, "can_decide": can_decide, "nav": "effects",
                                                      "deadline_s": deadline_s})


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}) \
            and target.startswith("/dashboard/"):
        return target
    return reverse("dashboard:effects")


def _find_effect(tenant: Tenant, key: str) -> tuple[dict[str, Any] | None, str]:
    try:
        found = effect_list(tenant=tenant, state="all", limit=200).get("effects", [])
    except (InstanceUnavailable, InstanceProblem) as exc:
        return None, exc.detail
    return next((e for e in found if e.get("key") == key), None), ""


@require_http_methods(["GET", "POST"])
@staff_required
def effect_decide_view(request: HttpRequest, tenant_id: uuid.UUID, effect_key: str) -> HttpResponse:
    if not request.user.has_perm(DECIDE):
        raise PermissionDenied(f"needs {DECIDE}")
    tenant = _tenant(tenant_id)
    try:
        effect_key = validate_effect_key(effect_key)
    except NotFound:
        raise Http404("effect not found") from None
    back = _safe_next(request)
    error, status = "", 200
    if request.method == "POST":
        decision = request.POST.get("decision", "")
        raw_result = request.POST.get("result", "").strip()
        try:
            result = json.loads(raw_result) if raw_result else None
        except ValueError:
            result, error = None, "The result must be JSON (an object such as {\"id\": \"ch_123\"}), or empty."
        if not error:
            try:
                accepted = effect_decide(tenant=tenant, effect_key=effect_key, decision=decision, result=result,
                                         note=request.POST.get("note", ""), actor=_actor(request),
                                         idempotency_key=f"dashboard:{request.POST.get('idempotency_key', '')[:100]}"
                                         if request.POST.get("idempotency_key") else None)
            except ApplicationError as exc:
                error = exc.detail
            else:
                item = accepted.item
                if item.status == InboxStatus.REFUSED:
                    messages.error(request, "The agent refused the decision: "
                                            + str((item.response or {}).get("detail") or "refused"))
                elif item.status == InboxStatus.PENDING:
                    messages.info(request, "The instance is not reachable; the decision waits in the inbox and "
                                           "is delivered as soon as it is back.")
                else:
                    messages.success(request, f"Decision recorded for {effect_key}: {decision}.")
                return redirect(back)
        status = 400
    effect, unreachable = _find_effect(tenant, effect_key)
    return render(request, "dashboard/effect_decide.html", {
        "tenant": tenant, "key": effect_key, "effect": effect, "unreachable": unreachable,
        "effect_result": json.dumps(effect.get("result"), indent=2) if effect and effect.get("result") else "",
        "decisions": DECISIONS, "chosen": request.POST.get("decision", ""), "error": error, "next": back,
        "idempotency_key": request.POST.get("idempotency_key") or uuid.uuid4().hex, "nav": "effects",
        "result_text": request.POST.get("result", ""), "note": request.POST.get("note", ""),
    }, status=status)
