"""Operator portal views: thin, and always scoped to ``request.operator`` (resolved from the host).

Every object is looked up through the operator (``tenant_get(operator=...)``, tokens filtered by
operator): another operator's customer, token or page is a 404, never a 403 that confirms it exists.
Secrets are write-only: a credential value is never rendered; an API token is shown once, in the
response to the request that issued it (``Cache-Control: no-store``).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from branding.selectors import current_theme, latest_revision, latest_rollout
from branding.services import branding_submit
from branding.validation import (
    branding_validate,
    clean_product_name,
    contrast_ratio,
    format_bytes,
    parse_hex_color,
    readable_on,
)
from controlplane.errors import ApplicationError, NoDefaultRelease, NotFound
from conversations.screens import CHAT_STATUSES, thread_from
from provisioning.choices import InstanceStatus, WorkflowKind, WorkflowStatus
from provisioning.models import WorkflowRun, WorkflowStep
from provisioning.recovery.health import instance_health
from provisioning.resources.kinds import RESOURCE_KINDS
from provisioning.workflows.onboarding import tenant_onboard
from releases.screens import default_release, tenant_release, tenant_releases
from releases.selectors import release_list
from schedules.screens import customer_schedules
from tenants.actors import Actor
from tenants.choices import ActorKind, TenantStatus
from tenants.models import OperatorToken, Tenant
from tenants.selectors import tenant_get, tenant_list
from tenants.tokens import operator_token_issue, operator_token_revoke
from vault.selectors import credential_list, credential_state
from vault.services import credential_put, credential_revoke

from .forms import (
    BrandingForm,
    CredentialForm,
    McpServerForm,
    OnboardForm,
    PortalAuthenticationForm,
    ScheduleForm,
    SizeLimitedUploadHandler,
)
from .models import OperatorMembership
from .selectors import branding_form_state, customer_recoveries, customer_usage

_IN_PROGRESS = {TenantStatus.PENDING, TenantStatus.PROVISIONING, TenantStatus.RECOVERING,
                TenantStatus.DEPROVISIONING}
# The onboarding progress list: one step per resource kind (provisioning/resources/kinds.py), then "ready".
STEP_LABELS = {**{str(row.kind): row.step_label for row in RESOURCE_KINDS}, "ready": "Ready"}


def member_required(*, admin: bool = False, act: bool = False,
                    ) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Signed in, and a member of the host's operator (else 404: nothing is confirmed to exist).
    ``admin``: admins only; ``act``: roles that may change things (viewers only look); both are 403."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            operator = getattr(request, "operator", None)
            if operator is None:
                raise Http404("not an operator host")
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path(), reverse("portal:login"))
            membership = OperatorMembership.objects.filter(user=request.user, operator=operator).first()
            if membership is None:
                raise Http404("not found")  # a user of another operator learns nothing
            if admin and not membership.is_admin:
                raise PermissionDenied("operator admins only")
            if act and not membership.can_act:
                raise PermissionDenied("viewers cannot change customers")
            request.membership = membership
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def _actor(request: HttpRequest) -> Actor:
    operator = request.operator
    return Actor(kind=ActorKind.USER, id=str(request.user.pk),
                 label=f"{request.user.get_username()} via {operator.slug} portal", operator_id=str(operator.pk))


def _customer(request: HttpRequest, tenant_id: object) -> Tenant:
    try:
        return tenant_get(operator=request.operator, tenant_id=tenant_id)
    except NotFound:
        raise Http404("customer not found") from None


class LoginView(auth_views.LoginView):
    template_name = "portal/login.html"
    authentication_form = PortalAuthenticationForm
    redirect_authenticated_user = False

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if getattr(request, "operator", None) is None:
            raise Http404("not an operator host")
        return super().dispatch(request, *args, **kwargs)

    def get_default_redirect_url(self) -> str:
        return reverse("portal:home")


# --- customers -----------------------------------------------------------------------------------------


def _home(request: HttpRequest, form: OnboardForm | None = None, status: int = 200) -> HttpResponse:
    q = request.GET.get("q", "")[:200].strip()
    wanted = request.GET.get("status", "")
    qs = tenant_list(operator=request.operator, status=wanted if wanted in TenantStatus.values else None)
    if wanted not in TenantStatus.values:
        qs = qs.exclude(status=TenantStatus.DELETED)  # archived customers only when asked for (status=deleted)
    if q:
        from django.db.models import Q

        qs = qs.filter(Q(slug__icontains=q) | Q(name__icontains=q))
    page = Paginator(qs, settings.PORTAL_PAGE_SIZE).get_page(request.GET.get("page"))
    releases = tenant_releases(page)
    for tenant in page:
        tenant.release_row = releases[tenant.pk]
    kept = {k: v for k, v in {"q": q, "status": wanted}.items() if v}
    form = form or OnboardForm(initial={"idempotency_key": uuid.uuid4().hex})
    return render(request, "portal/home.html", {
        "page": page, "q": q, "status": wanted, "statuses": TenantStatus.values, "form": form,
        "query": urlencode(kept) + "&" if kept else "", "nav": "customers",
    }, status=status)


@require_GET
@member_required()
def home(request: HttpRequest) -> HttpResponse:
    return _home(request)


@require_http_methods(["GET", "POST"])
@member_required()
def onboard(request: HttpRequest) -> HttpResponse:
    """The onboarding form's POST. A refused one answers at this URL (the form with its errors), so a reload of
    that page is a GET here: it goes back to the customer list and its form rather than a blank 405."""
    if request.method == "GET":
        return redirect("portal:home")
    if not request.membership.can_act:
        raise PermissionDenied("viewers cannot change customers")
    form = OnboardForm(request.POST)
    if not form.is_valid():
        return _home(request, form, status=400)
    try:
        tenant, _ = tenant_onboard(
            operator=request.operator, actor=_actor(request),
            slug=form.cleaned_data["slug"], name=form.cleaned_data["name"],
            idempotency_key=f"portal:{form.cleaned_data['idempotency_key']}",
            allow_no_release=form.cleaned_data["allow_no_release"],
        )
    except ApplicationError as exc:
        data = form.data.copy()
        data["idempotency_key"] = uuid.uuid4().hex  # a corrected submission is a new request
        retry = OnboardForm(data)
        retry.is_valid()
        if isinstance(exc, NoDefaultRelease):  # said in the form's words, next to the box that settles it
            retry.add_error("allow_no_release", "You have no default release yet: this customer would run no "
                            "release of yours. Make a release the default first (Releases), or tick this box.")
        else:
            retry.add_error(None, exc.detail)
        return _home(request, retry, status=400)
    messages.success(request, f"Onboarding {tenant.name} started. This page follows it live.")
    return redirect("portal:customer", tenant_id=tenant.pk)


# A finished workflow is history once the customer is at rest in one of these: a suspended customer's card said
# "Recover: 4 of 4 steps done" (issue 37), which reads as if something were still happening.
_AT_REST = {TenantStatus.SUSPENDED, TenantStatus.DELETED}


def _progress(tenant: Tenant) -> dict[str, Any]:
    run = (WorkflowRun.objects.filter(tenant=tenant).order_by("-created_at").first())
    if run is not None and tenant.status in _AT_REST and run.status == WorkflowStatus.SUCCEEDED:
        run = None
    steps = list(WorkflowStep.objects.filter(run=run).order_by("position")) if run else []
    done = sum(1 for s in steps if s.status == "done")
    return {
        "run": run,
        "steps": [(STEP_LABELS.get(s.name, s.name.replace("_", " ").capitalize()), s.status) for s in steps],
        "done": done,
        "total": len(steps),
        "percent": round(100 * done / len(steps)) if steps else 0,
        "onboarding": run is not None and run.kind == WorkflowKind.ONBOARD,
    }


def _settling(tenant: Tenant, instance: Any) -> bool:
    """Something is moving: a workflow, or an instance a worker is starting or stopping (suspend, resume,
    restart), so the live part refreshes quickly until it settles."""
    if tenant.status in _IN_PROGRESS:
        return True
    if instance is None:
        return False
    return instance.status in (InstanceStatus.PENDING, InstanceStatus.STARTING, InstanceStatus.RECOVERING) or (
        instance.status == InstanceStatus.STOPPED and tenant.status in (TenantStatus.READY, TenantStatus.DEGRADED))


def _customer_live_context(tenant: Tenant) -> dict[str, Any]:
    instance = getattr(tenant, "instance", None)
    return {"tenant": tenant, "progress": _progress(tenant), "health": instance_health(instance),
            "poll_s": 2 if _settling(tenant, instance) else 10}


def _customer_page_context(request: HttpRequest, tenant: Tenant) -> dict[str, Any]:
    from mcp_servers.selectors import tenant_mcp_server_list

    from .action_views import available_actions  # they import this module
    from .agent_config_views import agent_config_form
    from .connection_views import connections_panel
    from .conversation_views import chat_panel

    membership = request.membership
    return {**_customer_live_context(tenant), "nav": "customers",
            "credentials": [(c, credential_state(c)) for c in credential_list(tenant=tenant)],
            "chat": (chat_panel(tenant, thread_from(request), can_send=membership.can_act)
                     if tenant.status in CHAT_STATUSES else None),
            "actions": available_actions(tenant, membership), "can_act": membership.can_act,
            "recoveries": customer_recoveries(tenant), "usage": customer_usage(tenant),
            "release": tenant_release(tenant, with_boot=True), "default_release": default_release(tenant.operator),
            "releases": release_list(operator=tenant.operator) if membership.is_admin else [],
            "agent_config_form": agent_config_form(tenant), "schedules": customer_schedules(tenant),
            "mcp_servers": tenant_mcp_server_list(tenant=tenant), "mcp_server_form": McpServerForm(),
            "schedule_form": ScheduleForm(initial={"timezone": "UTC"}),
            **connections_panel(tenant)}


@require_GET
@member_required()
def customer(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    from .connection_views import connect_forms_allowed

    tenant = _customer(request, tenant_id)
    return connect_forms_allowed(render(request, "portal/customer.html", {
        **_customer_page_context(request, tenant), "credential_form": CredentialForm(),
    }), tenant)


@require_GET
@member_required()
def customer_live(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    return render(request, "portal/_customer_live.html", _customer_live_context(_customer(request, tenant_id)))


@require_POST
@member_required(act=True)
def credential_add(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    form = CredentialForm(request.POST)
    if form.is_valid():
        try:
            credential = credential_put(tenant=tenant, actor=_actor(request), name=form.cleaned_data["name"],
                                        value=form.cleaned_data["value"], one_time=form.cleaned_data["one_time"])
        except ApplicationError as exc:
            form.add_error(None, exc.detail)
        else:
            messages.success(request, f"Credential {credential.name} saved (version {credential.current_version}).")
            return redirect("portal:customer", tenant_id=tenant.pk)
    form.data = form.data.copy()
    form.data["value"] = ""  # never echo a value back
    from .connection_views import connect_forms_allowed

    return connect_forms_allowed(render(request, "portal/customer.html", {
        **_customer_page_context(request, tenant), "credential_form": form,
    }, status=400), tenant)


@require_http_methods(["GET", "POST"])
@member_required(act=True)
def credential_revoke_view(request: HttpRequest, tenant_id: uuid.UUID, name: str) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    found = credential_list(tenant=tenant).filter(name=name).first()
    if found is None:
        raise Http404("credential not found")
    if request.method == "POST":
        try:
            credential_revoke(tenant=tenant, name=name, actor=_actor(request))
            messages.success(request, f"Credential {name} revoked; the agent can no longer fetch it.")
        except ApplicationError as exc:
            messages.error(request, exc.detail)
        return redirect("portal:customer", tenant_id=tenant.pk)
    return render(request, "portal/confirm.html", {
        "title": f"Revoke credential {name}?", "nav": "customers",
        "explain": f"{tenant.name}'s agent will no longer be able to fetch {name}.",
        "button": "Yes, revoke", "cancel": reverse("portal:customer", args=[tenant.pk]),
    })


# --- API tokens ----------------------------------------------------------------------------------------


def _tokens_page(request: HttpRequest, *, issued: str = "", form: Any = None, status: int = 200) -> HttpResponse:
    from .forms import TokenForm

    tokens = OperatorToken.objects.filter(operator=request.operator).order_by("-created_at")
    response = render(request, "portal/tokens.html", {
        "tokens": tokens, "form": form or TokenForm(), "issued": issued, "nav": "tokens",
        "api_base": request.build_absolute_uri("/").rstrip("/"),
    }, status=status)
    add_never_cache_headers(response)  # the one response that carries a token must not be cached
    return response


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def tokens(request: HttpRequest) -> HttpResponse:
    from .forms import TokenForm

    if request.method == "GET":
        return _tokens_page(request)
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _tokens_page(request, form=form, status=400)
    try:
        issued = operator_token_issue(operator=request.operator, actor=_actor(request),
                                      name=form.cleaned_data["name"], scopes=form.cleaned_data["scopes"])
    except ApplicationError as exc:
        form.add_error(None, exc.detail)
        return _tokens_page(request, form=form, status=400)
    return _tokens_page(request, issued=issued.plaintext, form=TokenForm())


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def token_revoke(request: HttpRequest, prefix: str) -> HttpResponse:
    token = OperatorToken.objects.filter(operator=request.operator, prefix=prefix).first()
    if token is None:
        raise Http404("token not found")
    if request.method == "POST":
        operator_token_revoke(operator=request.operator, prefix=prefix, actor=_actor(request))
        messages.success(request, f"Token {token.name} ({prefix}) revoked.")
        return redirect("portal:tokens")
    return render(request, "portal/confirm.html", {
        "title": f"Revoke token {token.name}?", "nav": "tokens",
        "explain": f"Integrations using the token starting with cpk_{prefix} will get 401 from now on.",
        "button": "Yes, revoke", "cancel": reverse("portal:tokens"),
    })


# --- branding ------------------------------------------------------------------------------------------


def _branding_form(request: HttpRequest) -> tuple[BrandingForm, dict[str, str]]:
    """The form as the page opens: the published values, or the latest submission's own edits (with the
    job's errors attached when it was rejected), so a rejection never loses what the operator typed."""
    state = branding_form_state(request.operator)
    if not state.errors:
        return BrandingForm(initial=state.values), state.values
    form = BrandingForm(data=state.values)
    form.is_valid()
    _attach_errors(form, state.errors)
    return form, state.values


def _attach_errors(form: BrandingForm, errors: list[dict[str, str]]) -> None:
    for error in errors:
        name = error.get("field", "")
        form.add_error(name if name in form.fields else None, error["message"])


def _preview_context(request: HttpRequest, data: Any, logo: bytes | None, oversized: bool) -> dict[str, Any]:
    """Validate what is being edited with the same code as the job, for an honest preview."""
    report = branding_validate(product_name=data.get("product_name", ""), primary_color=data.get("primary_color", ""),
                               background_color=data.get("background_color", ""),
                               support_email=data.get("support_email", ""), logo=logo)
    errors = [m.message for m in report.errors]
    if oversized:
        errors.append(f"The logo is larger than {format_bytes(settings.BRANDING_LOGO_MAX_BYTES)}, the limit.")
    primary = parse_hex_color(data.get("primary_color")) or "#1f4b99"
    background = parse_hex_color(data.get("background_color")) or "#ffffff"
    name = clean_product_name(data.get("product_name", ""))[0] or request.operator.name
    logo_src = ""
    if report.clean is not None and report.clean.logo is not None:
        clean_logo = report.clean.logo
        logo_src = f"data:{clean_logo.content_type};base64,{base64.b64encode(clean_logo.data).decode()}"
    elif logo is None and not data.get("remove_logo"):
        theme = current_theme(request.operator)
        if theme is not None and theme.logo_id:
            logo_src = reverse("portal:asset", args=[theme.logo_id])
    return {
        "p": {"primary": primary, "background": background, "on_primary": readable_on(primary),
              "text": readable_on(background), "name": name, "logo_src": logo_src,
              "email": (data.get("support_email") or "").strip(),
              "contrast": round(contrast_ratio(primary, background), 2)},
        "preview_errors": errors,
        "preview_field_errors": [m.as_dict() for m in report.errors],
        "preview_warnings": [m.message for m in report.warnings],
    }


def _branding_page(request: HttpRequest, form: BrandingForm, preview: dict[str, Any],
                   status: int = 200) -> HttpResponse:
    operator = request.operator
    return render(request, "portal/branding.html", {
        "form": form, **preview, "nav": "branding", "current": current_theme(operator),
        "revision": latest_revision(operator), "rollout": latest_rollout(operator),
        "limit": format_bytes(settings.BRANDING_LOGO_MAX_BYTES),
    }, status=status)


def _read_logo(request: HttpRequest) -> tuple[bytes | None, bool]:
    oversized = "logo" in getattr(request, "oversized_uploads", [])
    upload = request.FILES.get("logo")
    return (upload.read() if upload is not None else None), oversized


def _limit_uploads(request: HttpRequest) -> None:
    # Before anything reads the body: nothing beyond the limit is kept, and we can say why.
    request.upload_handlers.insert(0, SizeLimitedUploadHandler(request, settings.BRANDING_LOGO_MAX_BYTES))


@csrf_exempt  # re-applied below, after the upload handler is in place (Django's documented pattern)
@member_required(admin=True)
def branding(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "POST"):
        return HttpResponse(status=405)
    _limit_uploads(request)
    return _branding_protected(request)


@csrf_protect
def _branding_protected(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        form, values = _branding_form(request)
        return _branding_page(request, form, _preview_context(request, values, None, False))
    form = BrandingForm(request.POST)
    logo, oversized = _read_logo(request)
    preview = _preview_context(request, request.POST, logo, oversized)
    if not form.is_valid() or oversized:
        if oversized:
            form.add_error("logo", f"The logo is larger than {format_bytes(settings.BRANDING_LOGO_MAX_BYTES)}, "
                                   "the limit. Use a smaller PNG, JPEG, WebP or SVG file.")
        return _branding_page(request, form, preview, status=400)
    if request.POST.get("action") == "preview":
        return _branding_page(request, form, preview)
    if preview["preview_field_errors"]:
        # The job would reject it with these same messages: refuse now, keeping every edit in the form.
        _attach_errors(form, preview["preview_field_errors"])
        return _branding_page(request, form, preview, status=400)
    try:
        branding_submit(operator=request.operator, actor=_actor(request), logo=logo,
                        **{k: form.cleaned_data[k] for k in ("product_name", "primary_color", "background_color",
                                                            "support_email", "remove_logo")})
    except ApplicationError as exc:
        form.add_error("logo", exc.detail)
        return _branding_page(request, form, preview, status=400)
    messages.info(request, "Branding submitted. It is being checked now; the result and the rollout to "
                           "your customers' agents appear below.")
    return redirect("portal:branding")


@csrf_exempt
@member_required(admin=True)
def branding_preview(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return HttpResponse(status=405)
    _limit_uploads(request)
    return _branding_preview_protected(request)


@csrf_protect
def _branding_preview_protected(request: HttpRequest) -> HttpResponse:
    logo, oversized = _read_logo(request)
    return render(request, "portal/_branding_preview.html", _preview_context(request, request.POST, logo, oversized))


@require_GET
@member_required(admin=True)
def branding_status(request: HttpRequest) -> HttpResponse:
    operator = request.operator
    revision = latest_revision(operator)
    response = render(request, "portal/_branding_status.html", {
        "current": current_theme(operator), "revision": revision, "rollout": latest_rollout(operator),
    })
    watched = request.GET.get("pending", "")
    if watched and (revision is None or str(revision.pk) != watched or revision.status != "pending"):
        # The submission the page was opened with has been decided: reload the whole page (htmx), so the
        # form shows the published values (or the edits with the job's errors) and the portal its new colours.
        response["HX-Refresh"] = "true"
    return response
