"""Operator portal: webhook endpoints, their delivery log, the test button and replay (admins only).

Thin views over ``webhooks.services`` and ``webhooks.selectors``, always through ``request.operator``: another
operator's endpoint or delivery is a 404. An endpoint's signing secret is rendered once, in the response to
the request that created it (``Cache-Control: no-store``), like an API token.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.errors import ApplicationError, NotFound
from tenants.actors import Actor
from tenants.choices import ActorKind
from webhooks.choices import EventType
from webhooks.selectors import delivery_get, delivery_list, endpoint_get, endpoint_list
from webhooks.services import delivery_replay, endpoint_create, endpoint_delete, endpoint_test

from .views import member_required

__all__ = ["webhooks", "webhook_endpoint", "webhook_test", "webhook_delete", "webhook_replay"]

_PREFIX_CHOICES = [(f"{p}.*", f"every {p} event") for p in ("tenant", "instance", "recovery", "task", "effect")]


class EndpointForm(forms.Form):
    url = forms.URLField(max_length=2000, label="URL", assume_scheme="https",
                         help_text="Where events are POSTed; https, on a public address.")
    description = forms.CharField(max_length=200, required=False)
    event_types = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Events",
        choices=_PREFIX_CHOICES + [(t, t) for t in EventType.values if t != EventType.WEBHOOK_TEST],
        help_text="None ticked: every event.")


def _actor(request: HttpRequest) -> Actor:
    operator = request.operator
    return Actor(kind=ActorKind.USER, id=str(request.user.pk),
                 label=f"{request.user.get_username()} via {operator.slug} portal", operator_id=str(operator.pk))


def _endpoint(request: HttpRequest, endpoint_id: object):
    try:
        return endpoint_get(operator=request.operator, endpoint_id=endpoint_id)
    except NotFound:
        raise Http404("webhook endpoint not found") from None


def _list_page(request: HttpRequest, *, form: EndpointForm | None = None, secret: str = "",
               created_url: str = "", status: int = 200) -> HttpResponse:
    response = render(request, "portal/webhooks.html", {
        "endpoints": endpoint_list(operator=request.operator),
        "form": form or EndpointForm(), "secret": secret, "created_url": created_url, "nav": "webhooks",
    }, status=status)
    add_never_cache_headers(response)  # the response that carries a secret must not be cached
    return response


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def webhooks(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _list_page(request)
    form = EndpointForm(request.POST)
    if not form.is_valid():
        return _list_page(request, form=form, status=400)
    try:
        created = endpoint_create(operator=request.operator, actor=_actor(request),
                                  url=form.cleaned_data["url"], description=form.cleaned_data["description"],
                                  event_types=form.cleaned_data["event_types"])
    except ApplicationError as exc:
        form.add_error(None, exc.detail)
        return _list_page(request, form=form, status=400)
    return _list_page(request, secret=created.secret, created_url=created.endpoint.url)


@require_http_methods(["GET"])
@member_required(admin=True)
def webhook_endpoint(request: HttpRequest, endpoint_id: object) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    # One query for every attempt on the page (was one per delivery: 28 queries at 25 rows, issue 37).
    deliveries = delivery_list(endpoint=endpoint).prefetch_related("attempt_log")
    page = Paginator(deliveries, settings.PORTAL_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [(d, list(d.attempt_log.all())) for d in page.object_list]
    return render(request, "portal/webhooks_endpoint.html", {
        "endpoint": endpoint, "page": page, "rows": rows, "nav": "webhooks",
        "schedule": settings.WEBHOOK_RETRY_SCHEDULE_S, "log_bytes": settings.WEBHOOK_LOG_RESPONSE_BYTES,
    })


@require_POST
@member_required(admin=True)
def webhook_test(request: HttpRequest, endpoint_id: object) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    delivery = endpoint_test(endpoint=endpoint, actor=_actor(request))
    messages.success(request, f"Test event {delivery.event_id} queued; its delivery appears below.")
    return redirect("portal:webhook-endpoint", endpoint_id=endpoint.pk)


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def webhook_delete(request: HttpRequest, endpoint_id: object) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    if request.method == "POST":
        endpoint_delete(endpoint=endpoint, actor=_actor(request))
        messages.success(request, f"Webhook endpoint {endpoint.url} deleted.")
        return redirect("portal:webhooks")
    return render(request, "portal/confirm.html", {
        "title": f"Delete the endpoint {endpoint.url}?", "nav": "webhooks",
        "explain": "No more events are sent to it; deliveries not yet made are cancelled.",
        "button": "Yes, delete", "cancel": reverse("portal:webhook-endpoint", args=[endpoint.pk]),
    })


@require_POST
@member_required(admin=True)
def webhook_replay(request: HttpRequest, delivery_id: object) -> HttpResponse:
    try:
        delivery = delivery_get(operator=request.operator, delivery_id=delivery_id)
    except NotFound:
        raise Http404("delivery not found") from None
    try:
        delivery_replay(delivery=delivery, actor=_actor(request))
        messages.success(request, f"Event {delivery.event_id} queued again.")
    except ApplicationError as exc:
        messages.error(request, exc.detail)
    return redirect("portal:webhook-endpoint", endpoint_id=delivery.endpoint_id)
