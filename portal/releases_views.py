"""Operator portal: agent releases (upload, default), rollouts (start, watch, pause, resume, abort, roll back)
and a customer's pin. Thin views over ``releases.services``, ``releases.assignments`` and ``releases.rollouts``.

Every member reads; only admins change anything (403 otherwise), like tokens and branding. Releases and
rollouts are looked up through ``request.operator`` (``releases.selectors``): another operator's are a 404.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from branding.validation import format_bytes
from controlplane.errors import ApplicationError, NotFound
from provisioning.fleet.actions import RESTARTABLE
from releases.assignments import release_default_set, tenant_release_pin
from releases.choices import ACTIVE_ROLLOUT_STATUSES
from releases.models import AgentRelease, ReleaseAssignment, Rollout
from releases.rollouts import rollout_abort, rollout_create, rollout_pause, rollout_resume, rollout_rollback
from releases.screens import (
    RUNTIME_AGENTS,
    count_rows,
    default_release,
    rollout_actions_allowed,
    rollout_counts,
    rollout_is_active,
    rollout_items,
)
from releases.selectors import release_get, release_list, rollout_get, rollout_list
from releases.services import MAX_NOTES_CHARS, release_create

from .forms import SizeLimitedUploadHandler
from .views import _actor, _customer, member_required

__all__ = ["releases", "release_upload", "release_default", "release_rollout", "rollouts", "rollout",
           "rollout_live", "rollout_action", "customer_release", "ReleaseUploadForm", "RolloutForm"]


class ReleaseUploadForm(forms.Form):
    file = forms.FileField(label="Wheel (.whl)", widget=forms.ClearableFileInput(attrs={"accept": ".whl"}),
                           help_text="Your agent package, built as a wheel; its version comes from the wheel.")
    notes = forms.CharField(max_length=MAX_NOTES_CHARS, required=False, label="Notes (optional)",
                            widget=forms.Textarea(attrs={"rows": 3}), help_text="What changed, for your team.")


class RolloutForm(forms.Form):
    """Shapes only: ranges and "canary or percent, not both" are the service's to refuse (its message is shown)."""

    canary = forms.IntegerField(required=False, label="Canary (customers)")
    canary_percent = forms.FloatField(required=False, label="or canary (% of customers)")
    wave_size = forms.IntegerField(required=False, label="Wave size (customers)")
    soak_s = forms.IntegerField(required=False, label="Soak (seconds)",
                                help_text="How long each wave must stay healthy before the next one starts.")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["canary"].help_text = (f"The first wave. Leave both canary fields empty for "
                                           f"{settings.RELEASE_ROLLOUT_CANARY}.")
        self.fields["canary_percent"].help_text = "At least one customer."
        self.fields["wave_size"].initial = settings.RELEASE_ROLLOUT_WAVE_SIZE
        self.fields["soak_s"].initial = settings.RELEASE_ROLLOUT_SOAK_S


def _release(request: HttpRequest, release_id: object) -> AgentRelease:
    try:
        return release_get(operator=request.operator, release_id=release_id)
    except NotFound:
        raise Http404("release not found") from None


def _rollout(request: HttpRequest, rollout_id: object) -> Rollout:
    try:
        return rollout_get(operator=request.operator, rollout_id=rollout_id)
    except NotFound:
        raise Http404("rollout not found") from None


# --- releases ------------------------------------------------------------------------------------------


def _releases_page(request: HttpRequest, form: ReleaseUploadForm | None = None, status: int = 200) -> HttpResponse:
    operator = request.operator
    default = default_release(operator)
    active = rollout_list(operator=operator).filter(status__in=ACTIVE_ROLLOUT_STATUSES).first()
    return render(request, "portal/releases.html", {
        "releases": release_list(operator=operator), "default": default, "active_rollout": active,
        "form": form or ReleaseUploadForm(), "limit": format_bytes(settings.RELEASE_MAX_WHEEL_BYTES),
        "runtime_agents": RUNTIME_AGENTS, "nav": "releases",
    }, status=status)


@require_GET
@member_required()
def releases(request: HttpRequest) -> HttpResponse:
    return _releases_page(request)


@csrf_exempt  # re-applied below, once the size-limiting upload handler is in place (as for the branding logo)
@member_required(admin=True)
def release_upload(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse(status=405)
    # Before anything reads the body: nothing past the limit is kept, and the page can say why.
    request.upload_handlers.insert(0, SizeLimitedUploadHandler(request, settings.RELEASE_MAX_WHEEL_BYTES))
    return _release_upload_protected(request)


@csrf_protect
def _release_upload_protected(request: HttpRequest) -> HttpResponse:
    form = ReleaseUploadForm(request.POST, request.FILES)
    if "file" in getattr(request, "oversized_uploads", []):
        form.is_valid()
        form.add_error("file", f"The wheel is larger than {format_bytes(settings.RELEASE_MAX_WHEEL_BYTES)}, the "
                               "limit.")
        return _releases_page(request, form, status=413)
    if not form.is_valid():
        return _releases_page(request, form, status=400)
    upload = form.cleaned_data["file"]
    try:
        release = release_create(operator=request.operator, filename=upload.name, data=upload.read(),
                                 notes=form.cleaned_data["notes"], actor=_actor(request))
    except ApplicationError as exc:
        form.add_error("file", f"Not registered: {exc.detail}")
        return _releases_page(request, form, status=exc.status_code if exc.status_code in (400, 409, 413) else 400)
    kinds = ", ".join(release.kinds) or "none"
    messages.success(request, f"Release {release.version} registered (agent kinds: {kinds}). Nobody runs it yet: "
                              "make it the default for new customers, or roll it out.")
    return redirect("portal:releases")


@require_POST
@member_required(admin=True)
def release_default(request: HttpRequest, release_id: uuid.UUID) -> HttpResponse:
    release = _release(request, release_id)
    try:
        release_default_set(operator=request.operator, release_id=release.pk, actor=_actor(request))
    except ApplicationError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, f"New customers now start on {release.version}. Running customers were not "
                                  "restarted: roll the release out to move them.")
    return redirect("portal:releases")


def _rollout_form_page(request: HttpRequest, release: AgentRelease, form: RolloutForm,
                       status: int = 200) -> HttpResponse:
    return render(request, "portal/release_rollout.html", {
        "release": release, "form": form, "default": default_release(request.operator),
        "pinned": ReleaseAssignment.objects.filter(tenant__operator=request.operator, tenant__status__in=RESTARTABLE,
                                                   pinned=True).count(),
        "nav": "releases",
    }, status=status)


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def release_rollout(request: HttpRequest, release_id: uuid.UUID) -> HttpResponse:
    release = _release(request, release_id)
    if request.method == "GET":
        return _rollout_form_page(request, release, RolloutForm())
    form = RolloutForm(request.POST)
    if not form.is_valid():
        return _rollout_form_page(request, release, form, status=400)
    try:
        rollout = rollout_create(operator=request.operator, release_id=release.pk, actor=_actor(request),
                                 **{k: form.cleaned_data[k] for k in ("canary", "canary_percent", "wave_size",
                                                                      "soak_s")})
    except ApplicationError as exc:
        form.add_error(None, exc.detail)
        return _rollout_form_page(request, release, form, status=409 if exc.status_code == 409 else 400)
    total = sum(rollout_counts([rollout])[rollout.pk].values())
    messages.success(request, f"Rollout of {release.version} started: {total} customer{'s' if total != 1 else ''} "
                              "to move, the canary first. This page follows it.")
    return redirect("portal:rollout", rollout_id=rollout.pk)


# --- rollouts ------------------------------------------------------------------------------------------


@require_GET
@member_required()
def rollouts(request: HttpRequest) -> HttpResponse:
    page = Paginator(rollout_list(operator=request.operator), settings.PORTAL_PAGE_SIZE).get_page(
        request.GET.get("page"))
    counts = rollout_counts(page)
    for r in page:
        r.counts = count_rows(counts[r.pk], nonzero=True)
    return render(request, "portal/rollouts.html", {"page": page, "query": "", "nav": "rollouts"})


@dataclass(frozen=True)
class RolloutAction:
    name: str
    perform: Any  # a releases.rollouts service: (rollout=, actor=) -> Rollout
    title: str
    explain: str
    button: str
    done: str
    danger: bool
    confirm: bool  # a confirmation page first (GET), then the POST


ACTIONS: dict[str, RolloutAction] = {a.name: a for a in (
    RolloutAction("pause", rollout_pause, "Pause the rollout of {version}",
                  "The customer being upgraded now finishes; nobody else is touched until you resume.",
                  "Pause", "Rollout paused: nobody else is upgraded until you resume it.", False, False),
    RolloutAction("resume", rollout_resume, "Resume the rollout of {version}",
                  "It carries on where it stopped, under the same health gate.", "Resume",
                  "Rollout resumed.", False, False),
    RolloutAction("abort", rollout_abort, "Abort the rollout of {version}?",
                  "It stops for good. Customers already upgraded keep {version}; the others are never touched. "
                  "Roll it back afterwards to return the upgraded ones to their previous release.",
                  "Yes, abort", "Rollout aborted: upgraded customers keep the release, the others were not "
                                "touched.", True, True),
    RolloutAction("rollback", rollout_rollback, "Roll back {version}?",
                  "Every customer this rollout upgraded is restarted on the release it ran before (at a step "
                  "boundary, resuming from its checkpoint). Customers it never touched are left alone.",
                  "Yes, roll back", "Rolling back: upgraded customers are returning to their previous release.",
                  True, True),
)}


def _rollout_live_context(request: HttpRequest, rollout: Rollout) -> dict[str, Any]:
    membership = request.membership
    allowed = rollout_actions_allowed(rollout) if membership.is_admin else []
    counts = rollout_counts([rollout])[rollout.pk]
    return {"rollout": rollout, "counts": count_rows(counts), "total": sum(counts.values()),
            "items": rollout_items(rollout), "actions": [ACTIONS[name] for name in allowed],
            "active": rollout_is_active(rollout),
            "runtime_agents": RUNTIME_AGENTS, "tenant_url": "portal:customer", "noun": "customer"}


@require_GET
@member_required()
def rollout(request: HttpRequest, rollout_id: uuid.UUID) -> HttpResponse:
    found = _rollout(request, rollout_id)
    return render(request, "portal/rollout.html", {**_rollout_live_context(request, found), "nav": "rollouts"})


@require_GET
@member_required()
def rollout_live(request: HttpRequest, rollout_id: uuid.UUID) -> HttpResponse:
    return render(request, "portal/_rollout_live.html", _rollout_live_context(request, _rollout(request, rollout_id)))


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def rollout_action(request: HttpRequest, rollout_id: uuid.UUID, action: str) -> HttpResponse:
    found = _rollout(request, rollout_id)  # first: another operator's rollout is a 404, whatever the action
    spec = ACTIONS.get(action)
    if spec is None:
        raise Http404("no such action")
    version = found.release.version
    if request.method == "GET":
        return render(request, "portal/confirm.html", {
            "title": spec.title.format(version=version), "explain": spec.explain.format(version=version),
            "button": spec.button, "cancel": reverse("portal:rollout", args=[found.pk]), "nav": "rollouts",
        })
    try:
        spec.perform(rollout=found, actor=_actor(request))
    except ApplicationError as exc:
        messages.error(request, f"{spec.button.removeprefix('Yes, ').capitalize()}: not done. {exc.detail}")
    else:
        messages.success(request, spec.done)
    return redirect("portal:rollout", rollout_id=found.pk)


# --- a customer's release ------------------------------------------------------------------------------


@require_POST
@member_required(admin=True)
def customer_release(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    """Pin the customer to one of the operator's releases, or (empty choice) let it follow the default."""
    tenant = _customer(request, tenant_id)
    wanted = request.POST.get("release", "").strip()
    release = _release(request, wanted) if wanted else None
    current = ReleaseAssignment.objects.filter(tenant=tenant).first()
    # No record yet: the service starts from the operator's default, so that is what "changed" is measured from.
    before = current.release_id if current else getattr(default_release(tenant.operator), "pk", None)
    try:
        assignment = tenant_release_pin(tenant=tenant, release_id=release.pk if release else None,
                                        pinned=release is not None, actor=_actor(request))
    except ApplicationError as exc:
        messages.error(request, f"Release of {tenant.name}: not changed. {exc.detail}")
        return redirect("portal:customer", tenant_id=tenant.pk)
    runs = assignment.release.version if assignment.release else RUNTIME_AGENTS
    what = f"pinned to {runs}" if assignment.pinned else f"follows your default ({runs})"
    moving = (" Its agent is restarting on it: it finishes its current step first, then resumes from its "
              "checkpoint.") if assignment.release_id != before else ""
    messages.success(request, f"{tenant.name} {what}.{moving}")
    return redirect("portal:customer", tenant_id=tenant.pk)
