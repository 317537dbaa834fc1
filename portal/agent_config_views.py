"""Operator portal: a customer's agent configuration, as a form generated from its release's JSON Schema.

One field per top-level property: strings, integers, numbers and booleans as inputs, enums as a choice, a
credential property (``"format": "credential"``) as a choice among the names in the customer's vault (never a
value), anything else as JSON, and the reserved key ``effects`` (the customer's own effect providers) as JSON. An
empty field means "the release's default". A release without a schema gets
one JSON textarea. The form only shapes input: ``releases.agent_configs.tenant_agent_config_set`` validates and
audits, and its refusal is shown on the field it names. Members read; admins save (403 otherwise).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane.errors import ApplicationError
from releases.agent_configs import AgentConfigView, tenant_agent_config_get, tenant_agent_config_set
from releases.config_schema import CONFIG_EFFECTS_KEY, CONFIG_MCP_KEY, CREDENTIAL_FORMAT
from tenants.models import Tenant
from vault.selectors import credential_list

from .connection_views import connect_forms_allowed
from .views import _actor, _customer, _customer_page_context, member_required

__all__ = ["AgentConfigForm", "agent_config_form", "customer_agent_config"]

_ALL = "__overrides__"  # the one field of a release without a schema
_BOOLEANS = [("", "Default"), ("true", "Yes"), ("false", "No")]


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# The reserved top-level keys, each with its own JSON field on the form.
_RESERVED = {
    CONFIG_EFFECTS_KEY: "This customer's own effect providers, as JSON: effect name -> {\"type\": \"http\" | "
                        "\"smtp\" | \"webhook\", \"url\": ...}; credentials by vault name only. Empty: the "
                        "release's default and the instance's providers.",
    CONFIG_MCP_KEY: "This customer's MCP servers, as JSON: server name -> {\"url\": ..., \"credential\": vault name, "
                    "\"tools\": {tool: \"read_only\" | \"idempotent\" | \"effect\"}}. Empty: the release's default "
                    "and the instance's servers.",
}

class AgentConfigForm(forms.Form):
    """Fields built from ``view.schema``; ``overrides()`` turns the cleaned data back into JSON values."""

    def __init__(self, view: AgentConfigView, credential_names: list[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.view = view
        self.kinds: dict[str, str] = {}
        properties = (view.schema or {}).get("properties") if view.schema is not None else None
        if properties is None:
            self.kinds[_ALL] = "json"
            self.fields[_ALL] = forms.CharField(
                label="Overrides (JSON object)", required=False, initial=json.dumps(view.overrides, indent=2),
                widget=forms.Textarea(attrs={"rows": 6}),
                help_text="This release declares no configuration schema: any JSON object; each key replaces the "
                          "release default's value.")
            return
        for name, definition in sorted(properties.items()):
            definition = definition if isinstance(definition, dict) else {}
            default = view.defaults.get(name)
            hint = str(definition.get("description", ""))
            hint = f"{hint} " if hint else ""
            hint += f"Default: {_shown(default)}." if name in view.defaults else "No default."
            initial = view.overrides.get(name)
            field: forms.Field
            if definition.get("format") == CREDENTIAL_FORMAT:
                kind = "credential"
                names = sorted(set(credential_names) | ({initial} if isinstance(initial, str) else set()))
                field = forms.ChoiceField(choices=[("", "Default"), *[(n, n) for n in names]], required=False,
                                          help_text=hint + " The name of a credential in this customer's vault; "
                                                           "the agent fetches its value when it needs it.")
            elif isinstance(definition.get("enum"), list):
                kind = "enum"
                field = forms.ChoiceField(choices=[("", "Default"), *[(json.dumps(v), _shown(v))
                                                                      for v in definition["enum"]]],
                                          required=False, help_text=hint)
                initial = json.dumps(initial) if name in view.overrides else None
            elif definition.get("type") == "boolean":
                kind = "boolean"
                field = forms.ChoiceField(choices=_BOOLEANS, required=False, help_text=hint)
                on = name in view.overrides and isinstance(initial, bool)  # a non-boolean override shows as Default
                initial = ("true" if initial else "false") if on else None
            elif definition.get("type") in ("string", "integer", "number"):
                kind = str(definition["type"])
                field = {"string": forms.CharField(required=False, strip=False),
                         "integer": forms.IntegerField(required=False),
                         "number": forms.FloatField(required=False)}[kind]
                field.help_text = hint
            else:
                kind = "json"
                field = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                                        help_text=hint + " As JSON.")
                initial = json.dumps(initial) if name in view.overrides else None
            field.label = name
            field.initial = initial
            self.kinds[name] = kind
            self.fields[name] = field
        for reserved, help_text in _RESERVED.items():
            if reserved in properties:
                continue
            # A reserved key is not in the agents' schema, yet a save must not drop what the customer set there.
            self.kinds[reserved] = "json"
            self.fields[reserved] = forms.CharField(
                label=reserved, required=False, widget=forms.Textarea(attrs={"rows": 3}),
                initial=json.dumps(view.overrides[reserved]) if reserved in view.overrides else None,
                help_text=help_text)

    def overrides(self) -> dict[str, Any]:
        """The overrides the form says (an empty field: no override); a JSON field that does not parse is an
        error on that field."""
        out: dict[str, Any] = {}
        for name, kind in self.kinds.items():
            value = self.cleaned_data.get(name)
            if value in (None, ""):
                continue
            if kind in ("json", "enum"):
                try:
                    parsed = json.loads(value)
                except ValueError:
                    self.add_error(name, "Not valid JSON.")
                    continue
                if name == _ALL:
                    if not isinstance(parsed, dict):
                        self.add_error(name, "A JSON object, please.")
                        continue
                    out.update(parsed)
                else:
                    out[name] = parsed
            elif kind == "boolean":
                out[name] = value == "true"
            else:
                out[name] = value
        return out


def agent_config_form(tenant: Tenant, data: Any = None) -> AgentConfigForm:
    names = list(credential_list(tenant=tenant).filter(revoked_at__isnull=True, consumed_at__isnull=True)
                 .values_list("name", flat=True))
    return AgentConfigForm(tenant_agent_config_get(tenant=tenant), names, data=data)


@require_POST
@member_required(admin=True)
def customer_agent_config(request: HttpRequest, tenant_id: uuid.UUID) -> HttpResponse:
    tenant = _customer(request, tenant_id)
    form = agent_config_form(tenant, request.POST)
    if form.is_valid():
        overrides = form.overrides()
        if form.is_valid():
            try:
                tenant_agent_config_set(tenant=tenant, overrides=overrides, actor=_actor(request))
            except ApplicationError as exc:
                field = str(exc.extra.get("field", "")).removeprefix("overrides.").split(".", 1)[0].split("[", 1)[0]
                form.add_error(field if field in form.fields else None, exc.detail)
            else:
                messages.success(request, f"Agent configuration of {tenant.name} saved: its next task uses it.")
                return redirect("portal:customer", tenant_id=tenant.pk)
    return connect_forms_allowed(render(request, "portal/customer.html", {
        **_customer_page_context(request, tenant), "agent_config_form": form,
    }, status=400), tenant)
