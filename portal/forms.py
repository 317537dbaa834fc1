"""Portal forms: shape and size checks only. The services do the real validation and raise
``ApplicationError``s, which the views attach to the form."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm, PasswordResetForm
from django.core.exceptions import ValidationError
from django.core.files.uploadhandler import FileUploadHandler, SkipFile

from conversations.choices import ThreadPolicy
from tenants.choices import TokenScope

from .choices import MembershipRole
from .models import OperatorMembership


class PortalAuthenticationForm(AuthenticationForm):
    """Only members of the host's operator may sign in; anyone else gets the usual vague message."""

    def __init__(self, request: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(request, *args, **kwargs)
        self.operator = getattr(request, "operator", None)

    def confirm_login_allowed(self, user: Any) -> None:
        super().confirm_login_allowed(user)
        if self.operator is None or not OperatorMembership.objects.filter(user=user, operator=self.operator).exists():
            raise ValidationError(self.error_messages["invalid_login"], code="invalid_login",
                                  params={"username": self.username_field.verbose_name})


class OnboardForm(forms.Form):
    name = forms.CharField(max_length=200, label="Customer name")
    slug = forms.CharField(max_length=63, label="Short name (slug)",
                           help_text="Lowercase letters, digits and '-'; used in URLs and reports.")
    # Without a default release a customer would run no release of yours: onboarding refuses unless this is ticked.
    allow_no_release = forms.BooleanField(
        required=False, label="Onboard without a release",
        help_text="Only when you have no default release yet: the customer then runs what the runtime has "
                  "installed until you roll a release out to it.")
    # A fresh key per rendered form: a double submit onboards the customer once.
    idempotency_key = forms.CharField(max_length=200, widget=forms.HiddenInput)


class CredentialForm(forms.Form):
    name = forms.CharField(max_length=100, label="Name", help_text="e.g. smtp-password or crm-api-key")
    value = forms.CharField(max_length=65536, label="Value", strip=False,
                            widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
                            help_text="Write-only: stored encrypted, delivered only to this customer's agent.")
    one_time = forms.BooleanField(required=False, label="Deliver once, then forget")


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, label="Token name", initial="default")
    scopes = forms.MultipleChoiceField(choices=TokenScope.choices, widget=forms.CheckboxSelectMultiple,
                                       initial=list(TokenScope.values))


class BrandingForm(forms.Form):
    product_name = forms.CharField(max_length=500, label="Product name")
    primary_color = forms.CharField(max_length=20, label="Primary colour",
                                    help_text="Buttons, links and the top bar.")
    background_color = forms.CharField(max_length=20, label="Background colour")
    support_email = forms.CharField(max_length=254, required=False, label="Support email")
    logo = forms.FileField(required=False, label="Logo",
                           help_text="PNG, JPEG, WebP or SVG. SVGs are cleaned of scripts and external links.")
    remove_logo = forms.BooleanField(required=False, label="Remove the current logo")


class SuspendForm(forms.Form):
    reason = forms.CharField(max_length=500, required=False, label="Reason (optional)",
                             help_text="Kept in the audit log, e.g. \"invoice overdue\".")


class InvitationForm(forms.Form):
    email = forms.EmailField(max_length=254, label="Email address")
    role = forms.ChoiceField(choices=MembershipRole.choices, initial=MembershipRole.MEMBER, label="Role")


class AcceptNewAccountForm(forms.Form):
    """Creating an account from an invitation; the password rules are checked by the service."""

    username = forms.CharField(max_length=150, label="Username",
                               widget=forms.TextInput(attrs={"autocomplete": "username"}))
    password1 = forms.CharField(label="Password", strip=False,
                                widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))
    password2 = forms.CharField(label="Password again", strip=False,
                                widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("password1") and data.get("password1") != data.get("password2"):
            self.add_error("password2", "The two passwords differ.")
        return data


class AcceptExistingAccountForm(forms.Form):
    """Attaching an account that already exists for the invited address: its owner signs in to agree."""

    username = forms.CharField(max_length=150, label="Username",
                               widget=forms.TextInput(attrs={"autocomplete": "username"}))
    password = forms.CharField(label="Password", strip=False,
                               widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}))


class PortalPasswordResetForm(PasswordResetForm):
    """Django's reset form, limited to members of the host's operator: a staff account or another
    operator's user gets no mail from this portal (the page says the same either way)."""

    def __init__(self, *args: Any, operator: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.operator = operator

    def get_users(self, email: str) -> Any:
        if self.operator is None:
            return iter(())
        from .services import password_reset_mail_allowed

        member_ids = set(OperatorMembership.objects.filter(operator=self.operator).values_list("user_id", flat=True))
        users = [user for user in super().get_users(email) if user.pk in member_ids]
        if users and not password_reset_mail_allowed(operator=self.operator, email=email):
            return iter(())  # one mail was sent moments ago: nothing more, and the same page
        return iter(users)


class SizeLimitedUploadHandler(FileUploadHandler):
    """Stops reading a file past ``limit`` bytes (nothing beyond it is kept in memory or on disk) and
    records which field was too large, so the view can say so clearly."""

    def __init__(self, request: Any, limit: int) -> None:
        super().__init__(request)
        self.limit = limit
        self.received = 0
        request.oversized_uploads = []

    def new_file(self, field_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, *args, **kwargs)
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > self.limit:
            self.request.oversized_uploads.append(self.field_name)
            raise SkipFile()
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


class McpServerForm(forms.Form):
    """A customer's own MCP server (its entry replaces one of yours of the same name). Per-tool kinds are set
    through the API (``tools``); the service checks the rest (https, the credential held, the provider known)."""

    name = forms.CharField(max_length=60, label="Name", help_text="What the agent calls it: ctx.mcp(\"name\").")
    url = forms.CharField(max_length=2000, label="URL", help_text="The server's streamable HTTP endpoint (https://).")
    credential = forms.CharField(max_length=200, required=False, label="Token from credential",
                                 help_text="The name of a credential of this customer's vault (or leave empty).")
    connection = forms.CharField(max_length=60, required=False, label="Or token from connected account",
                                 help_text="A provider this customer connected (or leave empty).")
    allowed_tools = forms.CharField(max_length=4000, required=False, label="Allowed tools",
                                    help_text="Comma-separated tool names; empty: every tool the server lists.")
    trust_annotations = forms.BooleanField(required=False, initial=True, label="Trust the server's tool hints",
                                           help_text="Unticked: every tool call goes through the effect ledger.")

    def clean_allowed_tools(self) -> list[str] | None:
        raw = self.cleaned_data.get("allowed_tools") or ""
        names = [t.strip() for t in raw.split(",") if t.strip()]
        return names or None


class ScheduleForm(forms.Form):
    """A schedule of the customer's agent: when (cron in a zone, or once at a local time in that zone), and what
    (a task with params, or a message into a thread). Meaning is checked by ``schedules.services``."""

    name = forms.CharField(max_length=100, label="Name", help_text="e.g. morning-reconcile; unique per customer")
    cron = forms.CharField(max_length=100, required=False, label="Repeat (cron)",
                           help_text="0 8 * * 1-5: 08:00 on weekdays; a sixth field is seconds. Or leave empty and "
                                     "give a moment below.")
    at = forms.DateTimeField(required=False, label="Or once, at", input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S",
                                                                                 "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"],
                             widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                             help_text="In the time zone below.")
    timezone = forms.CharField(max_length=64, initial="UTC", label="Time zone",
                               help_text="An IANA zone: UTC, Europe/Paris, America/New_York.")
    kind = forms.CharField(max_length=100, required=False, label="Task kind",
                           help_text="Run this task of the agent at each fire...")
    params = forms.CharField(max_length=16384, required=False, label="Task params (JSON object)",
                             widget=forms.Textarea(attrs={"rows": 2}), initial="{}")
    thread = forms.CharField(max_length=200, required=False, label="Or a message into conversation")
    content = forms.CharField(max_length=32000, required=False, label="Message to post", strip=False,
                              widget=forms.Textarea(attrs={"rows": 2}))
    catch_up = forms.ChoiceField(choices=[("latest", "run the latest missed time once"),
                                          ("skip", "skip missed times"),
                                          ("all", "run every missed time (up to 10)")],
                                 initial="latest", label="After downtime")

    def clean_params(self) -> dict[str, Any]:
        raw = self.cleaned_data.get("params") or "{}"
        try:
            value = json.loads(raw)
        except ValueError:
            raise ValidationError("must be a JSON object, e.g. {\"ledger\": \"main\"}") from None
        if not isinstance(value, dict):
            raise ValidationError("must be a JSON object, e.g. {\"ledger\": \"main\"}")
        return value


class ThreadPolicyForm(forms.Form):
    policy = forms.ChoiceField(choices=ThreadPolicy.choices)
