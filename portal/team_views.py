"""The portal's team pages: members and invitations (admins), accepting an invitation, password reset.

Thin: the services in ``portal.services`` do the work. Every link mailed from here is built on the
host the request came in on, i.e. the operator's own portal host, never the control plane's. Tokens
(invitation and reset) appear only in the mail: pages, messages and logs never echo them.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import authenticate, login
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.urls import reverse, reverse_lazy
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods

from branding.selectors import portal_theme
from controlplane.errors import ApplicationError

from .forms import AcceptExistingAccountForm, AcceptNewAccountForm, InvitationForm, PortalPasswordResetForm
from .models import OperatorMembership
from .selectors import pending_invitations, team_members
from .services import (
    InvitationRefused,
    existing_user_for,
    invitation_accept,
    invitation_check,
    invitation_issue,
    invitation_revoke,
    membership_remove,
)
from .views import _actor, member_required

# --- team (admins) -------------------------------------------------------------------------------------


def _team_page(request: HttpRequest, form: InvitationForm | None = None, status: int = 200) -> HttpResponse:
    operator = request.operator
    return render(request, "portal/team.html", {
        "members": team_members(operator), "invitations": pending_invitations(operator),
        "form": form or InvitationForm(), "nav": "team", "now": timezone.now(),
    }, status=status)


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def team(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _team_page(request)
    form = InvitationForm(request.POST)
    if not form.is_valid():
        return _team_page(request, form, status=400)
    operator = request.operator
    try:
        issued = invitation_issue(
            operator=operator, email=form.cleaned_data["email"], role=form.cleaned_data["role"],
            actor=_actor(request), invited_by=request.user, product_name=portal_theme(operator).product_name,
            link_for=lambda token: request.build_absolute_uri(reverse("portal:invitation-accept", args=[token])),
        )
    except ApplicationError as exc:
        form.add_error(None, exc.detail)
        return _team_page(request, form, status=400)
    messages.success(request, f"Invitation mailed to {issued.invitation.email}; the link works once, "
                              f"until {issued.invitation.expires_at:%Y-%m-%d %H:%M} UTC.")
    return redirect("portal:team")


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def invitation_revoke_view(request: HttpRequest, invitation_id: uuid.UUID) -> HttpResponse:
    operator = request.operator
    invitation = pending_invitations(operator).filter(pk=invitation_id).first()
    if invitation is None:
        raise Http404("invitation not found")
    if request.method == "POST":
        invitation_revoke(operator=operator, invitation_id=invitation.pk, actor=_actor(request))
        messages.success(request, f"The invitation to {invitation.email} was withdrawn; its link no longer works.")
        return redirect("portal:team")
    return render(request, "portal/confirm.html", {
        "title": f"Withdraw the invitation to {invitation.email}?", "nav": "team",
        "explain": "The link in the mail stops working at once. You can invite the address again later.",
        "button": "Yes, withdraw", "cancel": reverse("portal:team"),
    })


@require_http_methods(["GET", "POST"])
@member_required(admin=True)
def member_remove_view(request: HttpRequest, membership_id: int) -> HttpResponse:
    operator = request.operator
    membership = OperatorMembership.objects.filter(operator=operator, pk=membership_id).select_related("user").first()
    if membership is None:
        raise Http404("member not found")
    name = membership.user.get_username()
    if request.method == "POST":
        try:
            membership_remove(operator=operator, membership_id=membership.pk, actor=_actor(request))
            messages.success(request, f"{name} was removed from the team.")
        except ApplicationError as exc:
            messages.error(request, exc.detail)
        return redirect("portal:team")
    return render(request, "portal/confirm.html", {
        "title": f"Remove {name} from the team?", "nav": "team",
        "explain": f"{name} can no longer sign in to this portal. Their account itself is kept.",
        "button": "Yes, remove", "cancel": reverse("portal:team"),
    })


# --- accepting an invitation (anyone holding the link) -------------------------------------------------


def _refused(request: HttpRequest, exc: InvitationRefused) -> HttpResponse:
    response = render(request, "portal/invitation_invalid.html", {"detail": exc.detail, "reason": exc.reason},
                      status=exc.status_code)
    add_never_cache_headers(response)
    return response


def _on_operator_host(request: HttpRequest) -> Any:
    operator = getattr(request, "operator", None)
    if operator is None:
        raise Http404("not an operator host")
    return operator


def _accept(request: HttpRequest, operator: Any, token: str, existing: Any, form: Any) -> OperatorMembership | None:
    """Accept with the submitted form; ``None`` (the error on the form) when it cannot be done yet."""
    data = form.cleaned_data
    if existing is not None:
        user = authenticate(request, username=data["username"], password=data["password"])
        if user is None:
            form.add_error(None, "That username and password do not match.")
            return None
        return invitation_accept(operator=operator, token=token, existing_user=user)
    return invitation_accept(operator=operator, token=token, username=data["username"], password=data["password1"])


# As Django's PasswordResetConfirmView: the token moves from the URL into the session at once, so the form's
# page, its POSTs and any 4xx logged by django.request carry this placeholder, never a live token.
INVITATION_SESSION_KEY = "_portal_invitation_token"
INVITATION_URL_TOKEN = "accept"


@require_http_methods(["GET", "POST"])
def invitation_accept_view(request: HttpRequest, token: str) -> HttpResponse:
    operator = _on_operator_host(request)
    if token != INVITATION_URL_TOKEN:
        try:
            invitation_check(operator=operator, token=token)
        except InvitationRefused as exc:
            return _refused(request, exc)
        request.session[INVITATION_SESSION_KEY] = token
        return redirect("portal:invitation-accept", token=INVITATION_URL_TOKEN)
    token = request.session.get(INVITATION_SESSION_KEY, "")
    try:
        invitation = invitation_check(operator=operator, token=token)
    except InvitationRefused as exc:
        return _refused(request, exc)
    existing = existing_user_for(invitation)
    form_class = AcceptExistingAccountForm if existing is not None else AcceptNewAccountForm
    form = form_class(request.POST or None, initial={"username": existing.get_username()} if existing else None)
    status = 200
    if request.method == "POST":
        status = 400
        membership = None
        if form.is_valid():
            try:
                membership = _accept(request, operator, token, existing, form)
            except InvitationRefused as exc:
                return _refused(request, exc)
            except ApplicationError as exc:
                form.add_error(None, exc.detail)
        if membership is not None:
            request.session.pop(INVITATION_SESSION_KEY, None)
            login(request, membership.user, backend=settings.AUTHENTICATION_BACKENDS[0])
            messages.success(request, f"Welcome to {operator.name}'s team, {membership.user.get_username()}.")
            return redirect("portal:home")
    response = render(request, "portal/invitation_accept.html", {
        "invitation": invitation, "form": form, "existing": existing is not None,
    }, status=status)
    add_never_cache_headers(response)
    return response


# --- password reset (Django's own views, portal templates, members of this operator only) --------------


class _OnOperatorHost:
    """Operator hosts only, GET and POST only: Django's confirm view answers an invalid link with its page
    whatever the method, and its form views take PUT as POST."""

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        _on_operator_host(request)
        if request.method not in ("GET", "HEAD", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]


class PasswordResetView(_OnOperatorHost, auth_views.PasswordResetView):
    template_name = "portal/password_reset_form.html"
    email_template_name = "portal/email/password_reset.txt"
    subject_template_name = "portal/email/password_reset_subject.txt"
    form_class = PortalPasswordResetForm
    success_url = reverse_lazy("portal:password-reset-done")

    def get_form_kwargs(self) -> dict[str, Any]:
        return {**super().get_form_kwargs(), "operator": self.request.operator}

    def form_valid(self, form: Any) -> HttpResponse:
        # The mail's "site" is this operator's brand; domain and protocol come from the request's host.
        self.extra_email_context = {"product_name": portal_theme(self.request.operator).product_name}
        return super().form_valid(form)


class PasswordResetDoneView(_OnOperatorHost, auth_views.PasswordResetDoneView):
    template_name = "portal/password_reset_done.html"


class PasswordResetConfirmView(_OnOperatorHost, auth_views.PasswordResetConfirmView):
    template_name = "portal/password_reset_confirm.html"
    success_url = reverse_lazy("portal:password-reset-complete")

    def get_user(self, uidb64: str) -> Any:
        user = super().get_user(uidb64)
        operator = self.request.operator
        if user is not None and not OperatorMembership.objects.filter(user=user, operator=operator).exists():
            return None  # a link for someone outside this operator's team is as invalid as a forged one
        return user


class PasswordResetCompleteView(_OnOperatorHost, auth_views.PasswordResetCompleteView):
    template_name = "portal/password_reset_complete.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        # Django's view reverses settings.LOGIN_URL, the staff dashboard's, which this host does not serve.
        return {**super(auth_views.PasswordResetCompleteView, self).get_context_data(**kwargs),
                "login_url": reverse("portal:login")}
