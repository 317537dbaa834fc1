"""Forms shared by the staff dashboard and the operator portal. Shape checks only: no service is called here."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

__all__ = ["DeprovisionForm"]


class DeprovisionForm(forms.Form):
    """Type-the-slug confirmation: a deprovision that cannot be undone needs the customer named, not a click."""

    confirm_slug = forms.CharField(max_length=63, label="Type the customer's short name to confirm",
                                   widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}))

    def __init__(self, *args: Any, expected_slug: str, label: str | None = None, **kwargs: Any) -> None:
        """``label``: the dashboard says "tenant's slug" where the portal says "customer's short name"."""
        super().__init__(*args, **kwargs)
        self.expected_slug = expected_slug
        if label is not None:
            self.fields["confirm_slug"].label = label
        self.fields["confirm_slug"].help_text = f"Type {expected_slug} exactly."

    def clean_confirm_slug(self) -> str:
        typed = self.cleaned_data["confirm_slug"].strip()
        if typed != self.expected_slug:
            raise ValidationError(f"That is not {self.expected_slug}; nothing was deprovisioned.", code="mismatch")
        return typed
