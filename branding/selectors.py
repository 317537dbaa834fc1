"""Branding reads: an operator's current theme, latest submission and rollout, and the colours to paint with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenants.models import Operator

from .models import BrandingRevision, RolloutJob, Theme
from .validation import AA_MIN_CONTRAST, contrast_ratio, parse_hex_color, readable_on

__all__ = ["PortalTheme", "current_theme", "current_theme_document", "latest_revision", "latest_rollout",
           "portal_theme"]

_DEFAULT_PRIMARY, _DEFAULT_BACKGROUND = "#1f4b99", "#ffffff"


@dataclass(frozen=True)
class PortalTheme:
    """What the portal paints with. Colours are validated '#rrggbb' values, safe inside a <style>."""

    product_name: str
    support_email: str
    primary: str
    on_primary: str
    background: str
    text: str
    logo_sha256: str
    version: int | None
    content_hash: str


def current_theme(operator: Operator) -> Theme | None:
    return Theme.objects.filter(operator=operator).order_by("-activated_at", "-version").first()


def current_theme_document(operator: Operator) -> dict[str, Any] | None:
    """The current theme's document (what an instance mounts), None when the operator has none yet."""
    theme = current_theme(operator)
    return theme.document if theme is not None else None


def latest_revision(operator: Operator) -> BrandingRevision | None:
    return BrandingRevision.objects.filter(operator=operator).order_by("-created_at").first()


def latest_rollout(operator: Operator) -> RolloutJob | None:
    return RolloutJob.objects.filter(operator=operator).select_related("theme").order_by("-created_at").first()


def portal_theme(operator: Operator) -> PortalTheme:
    theme = current_theme(operator)
    if theme is not None:
        doc = theme.document
        colors = doc.get("colors", {})
        return PortalTheme(
            product_name=doc.get("product_name") or operator.name, support_email=doc.get("support_email", ""),
            primary=colors["primary"], on_primary=colors["on_primary"], background=colors["background"],
            text=colors["text"], logo_sha256=theme.logo_id or "", version=theme.version,
            content_hash=theme.content_hash,
        )
    # Never published: the operator's own fields, as long as they are valid and readable.
    primary = parse_hex_color(operator.primary_color) or _DEFAULT_PRIMARY
    background = parse_hex_color(operator.background_color) or _DEFAULT_BACKGROUND
    if contrast_ratio(primary, background) < AA_MIN_CONTRAST:
        primary, background = _DEFAULT_PRIMARY, _DEFAULT_BACKGROUND
    return PortalTheme(
        product_name=operator.product_name or operator.name, support_email=operator.support_email,
        primary=primary, on_primary=readable_on(primary), background=background, text=readable_on(background),
        logo_sha256="", version=None, content_hash="",
    )
