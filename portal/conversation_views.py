"""Portal pages for talking to a customer's agent: the chat (send, reply stream, the conversation's thread
policy), tasks, one task, the log.

Same rules as ``portal.views``: the operator comes from the host, the customer is looked up through it
(another operator's customer is a 404), every member may use these pages. The screens themselves are
shared with the staff dashboard (``conversations.screens``).
"""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from controlplane.errors import ApplicationError
from conversations import screens
from conversations.choices import ThreadPolicy
from conversations.services import thread_policy_set
from tenants.models import Tenant

from .forms import ThreadPolicyForm
from .views import _actor, _customer, member_required


def _reply_url(tenant: Tenant, thread: str):
    return lambda message_id: reverse("portal:chat-reply", args=[tenant.pk, thread, message_id])


def chat_panel(tenant: Tenant, thread: str, *, can_send: bool = True) -> dict[str, object]:
    """The chat panel's context on the customer page (read only for viewers: no sending, no policy change)."""
    return screens.chat_context(tenant=tenant, thread=thread,
                                send_url=reverse("portal:chat-send", args=[tenant.pk, thread]),
                                reply_url=_reply_url(tenant, thread), can_send=can_send,
                                policy_url=reverse("portal:thread-policy", args=[tenant.pk, thread]) if can_send
                                else "")


def _chat_url(tenant: Tenant, thread: str) -> str:
    return reverse("portal:customer", args=[tenant.pk]) + (
        "?" + urlencode({"thread": thread}) if thread != screens.DEFAULT_THREAD else "") + "#chat"


@require_POST
@member_required(act=True)
def thread_policy(request: HttpRequest, tenant_id: uuid.UUID, thread: str) -> HttpResponse:
    """What a message arriving while this thread's answer is still running does to it (audited)."""
    tenant = _customer(request, tenant_id)
    form = ThreadPolicyForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose one of: " + ", ".join(ThreadPolicy.values) + ".")
        return redirect(_chat_url(tenant, thread))
    try:
        thread_policy_set(tenant=tenant, thread=thread, policy=form.cleaned_data["policy"], actor=_actor(request))
    except ApplicationError as refused:
        messages.error(request, refused.detail)
    else:
        messages.success(request, f"Conversation {thread}: {form.cleaned_data['policy']}.")
    return redirect(_chat_url(tenant, thread))


@require_POST
@member_required(act=True)
def chat_send(request: HttpRequest, tenant_id: uuid.UUID, thread: str) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    back = _chat_url(tenant, thread)
    return screens.message_post(request, tenant=tenant, thread=thread, actor=_actor(request),
                                key_prefix=f"portal:{request.user.pk}", reply_url=_reply_url(tenant, thread),
                                back_url=back)


@require_GET
@member_required()
def chat_reply(request: HttpRequest, tenant_id: uuid.UUID, thread: str, message_id: str) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    return screens.reply_stream(tenant=tenant, thread=thread, message_id=message_id)


@require_GET
@member_required()
def tasks(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    ctx = screens.tasks_context(request, tenant=tenant,
                                task_url=lambda task_id: reverse("portal:task", args=[tenant.pk, task_id]))
    return render(request, "portal/tasks.html", {**ctx, "tenant": tenant, "nav": "customers"})


@require_GET
@member_required()
def task(request: HttpRequest, tenant_id: uuid.UUID, task_id: str) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    # Members who may act get the Retry button (viewers see the same page without it).
    can_act = request.membership.can_act
    retry_url = reverse("portal:task-retry", args=[tenant.pk, task_id]) if can_act else None
    cancel_url = reverse("portal:task-cancel", args=[tenant.pk, task_id]) if can_act else None
    return render(request, "portal/task.html", {**screens.task_context(tenant=tenant, task_id=task_id,
                                                                       retry_url=retry_url, cancel_url=cancel_url),
                                                "tenant": tenant, "nav": "customers"})


@require_POST
@member_required(act=True)
def task_retry(request: HttpRequest, tenant_id: uuid.UUID, task_id: str) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    return screens.task_retry_post(request, tenant=tenant, task_id=task_id, actor=_actor(request),
                                   key_prefix=f"portal:{request.user.pk}",
                                   back_url=reverse("portal:task", args=[tenant.pk, task_id]))


@require_http_methods(["GET", "POST"])
@member_required(act=True)
def task_cancel(request: HttpRequest, tenant_id: uuid.UUID, task_id: str) -> HttpResponse:
    """The task page's Cancel leads here: a confirm page saying what cancelling does; only its POST cancels."""
    tenant = _customer(request, tenant_id)
    back_url = reverse("portal:task", args=[tenant.pk, task_id])
    if screens.task_cancel_confirmed(request):
        return screens.task_cancel_post(request, tenant=tenant, task_id=task_id, actor=_actor(request),
                                        key_prefix=f"portal:{request.user.pk}", back_url=back_url)
    ctx = screens.task_cancel_confirm_context(tenant=tenant, task_id=task_id, back_url=back_url,
                                              cancel_url=reverse("portal:task-cancel", args=[tenant.pk, task_id]))
    return render(request, "portal/task_cancel.html", {**ctx, "tenant": tenant, "nav": "customers"})


@require_GET
@member_required()
def logs(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    """The log screen, or (with ``since``) the follow poll's rows; another operator's customer is a 404."""
    tenant = _customer(request, tenant_id)
    ctx = screens.logs_context(request, tenant=tenant, logs_url=reverse("portal:logs", args=[tenant.pk]),
                               task_url=lambda task_id: reverse("portal:task", args=[tenant.pk, task_id]))
    if ctx["partial"]:
        return render(request, "ui/agent/_log_follow.html", ctx)
    return render(request, "portal/logs.html", {**ctx, "tenant": tenant, "nav": "customers"})
