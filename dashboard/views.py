"""Staff dashboard views: thin; each reads through a selector or calls one service.

Every page needs a staff user; every action also needs its own permission (see ``models.py``).
Actions are two steps without JavaScript: GET shows a confirmation page, POST (with CSRF) acts.
Fragments under ``.../live`` are what HTMX polls; the full pages include them, so nothing needs JS.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from controlplane.errors import ApplicationError
from egress.selectors import allow_list_for_tenant, decision_list
from provisioning.choices import ResourceKind, WorkflowStatus
from provisioning.fleet.actions import instance_restart_request, tenant_resume, tenant_suspend
from provisioning.fleet.instances import instance_kill
from provisioning.models import WorkflowRun
from provisioning.recovery.health import instance_health
from provisioning.recovery.sweep import recovery_retry
from provisioning.services import workflow_retry
from provisioning.workflows.onboarding import tenant_deprovision
from releases.screens import tenant_release, tenant_releases
from schedules.screens import customer_schedules
from tenants.actors import Actor
from tenants.choices import TenantStatus
from tenants.forms import DeprovisionForm
from tenants.models import Operator, Tenant
from vault.models import RotationJob, TenantDataKey
from vault.selectors import credential_list, credential_state

from . import selectors, services


class StaffAuthenticationForm(AuthenticationForm):
    def confirm_login_allowed(self, user: Any) -> None:
        super().confirm_login_allowed(user)
        if not user.is_staff:
            raise ValidationError(self.error_messages["invalid_login"], code="invalid_login",
                                  params={"username": self.username_field.verbose_name})


class LoginView(auth_views.LoginView):
    template_name = "dashboard/login.html"
    authentication_form = StaffAuthenticationForm
    redirect_authenticated_user = True

    def get_default_redirect_url(self) -> str:
        return reverse("dashboard:overview")


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("dashboard:login"))
        if not request.user.is_staff:
            raise PermissionDenied("staff only")
        return view(request, *args, **kwargs)

    return wrapper


def _actor(request: HttpRequest) -> Actor:
    return Actor.for_user(request.user)


def _tenant(tenant_id: uuid.UUID) -> Tenant:
    return get_object_or_404(Tenant.objects.select_related("operator"), pk=tenant_id)


@require_GET
@staff_required
def overview(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/overview.html", {"o": selectors.overview(), "nav": "overview"})


@require_GET
@staff_required
def overview_live(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/_overview_live.html", {"o": selectors.overview()})


@require_GET
@staff_required
def tenant_list(request: HttpRequest) -> HttpResponse:
    q = request.GET.get("q", "")[:200]
    status = request.GET.get("status", "")
    operator = request.GET.get("operator", "")[:63]
    failed = request.GET.get("workflow") == "failed"
    qs = selectors.tenant_search(q=q, status=status, operator=operator, failed_workflows=failed)
    page = Paginator(qs, settings.DASHBOARD_PAGE_SIZE).get_page(request.GET.get("page"))
    releases = tenant_releases(page)
    for tenant in page:
        tenant.release_row = releases[tenant.pk]
        # The instance as its heartbeat says, not only its row: a "running" row whose heartbeat is stale (a dead
        # process the sweep has not recovered yet) is shown stale, never as a green "running".
        tenant.health = instance_health(getattr(tenant, "instance", None))
    kept = {k: v for k, v in {"q": q, "status": status, "operator": operator,
                              "workflow": "failed" if failed else ""}.items() if v}
    return render(request, "dashboard/tenant_list.html", {
        "page": page, "q": q, "status": status, "operator": operator, "failed": failed,
        "statuses": TenantStatus.values, "operators": Operator.objects.order_by("slug").values_list("slug", flat=True),
        "query": urlencode(kept) + "&" if kept else "", "nav": "tenants",
    })


def _tenant_live_context(tenant: Tenant) -> dict[str, Any]:
    instance = getattr(tenant, "instance", None) if hasattr(tenant, "instance") else None
    resources = list(tenant.resources.order_by("id"))
    runtime = next((r for r in resources if r.kind == ResourceKind.RUNTIME), None)
    database = next((r for r in resources if r.kind == ResourceKind.DATABASE), None)
    return {
        "tenant": tenant,
        "health": instance_health(instance),
        "instance": instance,
        "isolation": dict(runtime.details) if runtime is not None and "isolation" in runtime.details else None,
        "database_auth": dict(database.details) if database is not None and "auth" in database.details else None,
        "resources": resources,
        "runs": selectors.workflow_runs(tenant),
        "branding": getattr(tenant, "branding", None) if hasattr(tenant, "branding") else None,
    }


@require_GET
@staff_required
def tenant_detail(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _tenant(tenant_id)
    credentials = [(c, credential_state(c)) for c in credential_list(tenant=tenant, include_system=True)]
    audit = Paginator(selectors.audit_log(tenant), 20).get_page(request.GET.get("page"))
    return render(request, "dashboard/tenant_detail.html", {
        **_tenant_live_context(tenant),
        "credentials": credentials,
        "data_keys": TenantDataKey.objects.filter(tenant=tenant).order_by("purpose", "-version"),
        "rotations": RotationJob.objects.filter(tenant=tenant).order_by("-created_at")[:5],
        "recoveries": selectors.recovery_events(tenant),
        "page": audit, "query": "", "nav": "tenants",
        "can": {name: request.user.has_perm(action.permission) for name, action in ACTIONS.items()},
        "chat": _chat_panel(request, tenant),
        "release": tenant_release(tenant, with_boot=True),
        "schedules": customer_schedules(tenant),
        "can_pause_schedules": request.user.has_perm("dashboard.pause_schedule"),
        "egress_rules": allow_list_for_tenant(tenant_id=tenant.pk).rules,
        "egress_decisions": decision_list(tenant=tenant)[:20],
    })


def _chat_panel(request: HttpRequest, tenant: Tenant) -> dict[str, Any] | None:
    from .conversation_views import chat_panel  # it imports this module

    return chat_panel(request, tenant)


@require_GET
@staff_required
def tenant_live(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _tenant(tenant_id)
    return render(request, "dashboard/_tenant_live.html", {
        **_tenant_live_context(tenant),
        "can": {name: request.user.has_perm(action.permission) for name, action in ACTIONS.items()},
    })


# --- actions -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    permission: str
    title: str
    explain: str
    button: str
    danger: bool
    perform: Callable[[HttpRequest, Tenant, WorkflowRun | None], str]
    # What the POST must carry before ``perform`` runs (deprovision: the tenant's slug, typed); GET gets it unbound.
    confirm_form: Callable[[Tenant, Any], forms.Form] | None = None


def _retry(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    assert run is not None
    workflow_retry(run=run, actor=_actor(request))
    return f"The {run.kind} workflow was queued again from its failed step."


def _restart(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    instance_restart_request(tenant=tenant, actor=_actor(request))
    return "A restart was queued: the instance stops at its next step boundary and starts again (this page follows it)."


def _kill(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    pid = instance_kill(tenant=tenant, actor=_actor(request))
    return f"The instance process {pid} was killed; recovery will bring it back from its last checkpoint."


def _recover(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    recovery_retry(instance=tenant.instance, actor=_actor(request))
    return "A recovery was started; automatic recoveries resume once it succeeds."


def _suspend(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    tenant_suspend(tenant=tenant, actor=_actor(request), reason=f"suspended by staff ({request.user})")
    return "The tenant is suspended; its instance is being stopped."


def _resume(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    tenant_resume(tenant=tenant, actor=_actor(request))
    return "The tenant is ready again; its instance is starting."


def _deprovision(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    tenant_deprovision(tenant=tenant, actor=_actor(request))
    return "Deprovisioning started: the database is archived, then every resource is removed."


def _deprovision_form(tenant: Tenant, data: Any) -> forms.Form:
    return DeprovisionForm(data, expected_slug=tenant.slug, label="Type the tenant's slug to confirm")


def _rotate(request: HttpRequest, tenant: Tenant, run: WorkflowRun | None) -> str:
    jobs = services.tenant_keys_rotate(tenant=tenant, actor=_actor(request))
    return f"Key rotation queued ({len(jobs)} jobs); progress is shown under Keys."


ACTIONS: dict[str, Action] = {
    "retry": Action("dashboard.retry_workflow", "Retry the failed step",
                    "The failed step gets a fresh set of attempts; steps already done are not repeated.",
                    "Yes, retry", False, _retry),
    "restart": Action("dashboard.restart_instance", "Restart the instance",
                      "The agent is stopped gracefully (it finishes its current step and flushes) and started "
                      "again; it resumes from its last checkpoint.", "Yes, restart", False, _restart),
    "kill": Action("dashboard.kill_instance", "Kill the instance",
                   "The process is killed immediately (SIGKILL), as a crash would. Use it to test recovery.",
                   "Yes, kill it", True, _kill),
    "recover": Action("dashboard.restart_instance", "Retry the recovery",
                      "Lifts the quarantine (or the backoff) and recovers the instance now: stop what is left, "
                      "repair its resources, start it, check it resumed.", "Yes, recover now", False, _recover),
    "suspend": Action("dashboard.suspend_tenant", "Suspend the tenant",
                      "The instance is stopped at a step boundary; data and resources are kept, messages wait in "
                      "the inbox.", "Yes, suspend",
                      True, _suspend),
    "resume": Action("dashboard.suspend_tenant", "Resume the tenant",
                     "The tenant becomes ready again and its instance starts, from its last checkpoint.",
                     "Yes, resume", False, _resume),
    "deprovision": Action("dashboard.deprovision_tenant", "Deprovision the tenant",
                          "The database schema is archived (encrypted) and every resource is deleted. "
                          "This cannot be undone.", "Yes, deprovision", True, _deprovision,
                          _deprovision_form),
    "rotate_keys": Action("dashboard.rotate_keys", "Rotate the tenant's keys",
                          "New data-key versions are created; credentials are re-encrypted under the new key "
                          "in the background. Nothing is interrupted.", "Yes, rotate", False, _rotate),
}


@require_http_methods(["GET", "POST"])
@staff_required
def tenant_action(request: HttpRequest, tenant_id: uuid.UUID, action: str,
                  run_id: uuid.UUID | None = None) -> HttpResponse:
    spec = ACTIONS.get(action)
    if spec is None or (action == "retry") != (run_id is not None):
        raise Http404("no such action")
    if not request.user.has_perm(spec.permission):
        raise PermissionDenied(f"needs {spec.permission}")
    tenant = _tenant(tenant_id)
    run = get_object_or_404(WorkflowRun, pk=run_id, tenant=tenant) if run_id is not None else None
    data = request.POST if request.method == "POST" else None  # an empty POST is bound: "required" is shown
    form = spec.confirm_form(tenant, data) if spec.confirm_form is not None else None
    if request.method == "POST" and (form is None or form.is_valid()):
        try:
            messages.success(request, spec.perform(request, tenant, run))
        except ApplicationError as exc:
            messages.error(request, f"{spec.title} failed: {exc.detail}")
        return redirect("dashboard:tenant", tenant_id=tenant.pk)
    # GET, or a POST whose confirmation did not match: the page again, with the form's error (400, nothing done).
    return render(request, "dashboard/confirm.html", {
        "tenant": tenant, "run": run, "action": spec, "form": form, "nav": "tenants",
        "failed_step": run.steps.filter(status="failed").first() if run is not None else None,
        "run_failed": run is not None and run.status == WorkflowStatus.FAILED,
    }, status=400 if request.method == "POST" else 200)
