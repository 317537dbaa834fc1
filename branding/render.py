"""Render a validated branding into a theme document and its content hash. No I/O here.

The document is what every instance receives (a file on the volume locally, a ConfigMap in
Kubernetes). Its identity is the SHA-256 of its canonical JSON bytes: the same branding always
renders to the same bytes, so rollout can skip an instance that already has it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from .validation import CleanBranding, readable_on

__all__ = ["THEME_SCHEMA", "theme_document", "theme_bytes", "theme_hash", "theme_css"]

THEME_SCHEMA = "branding/v1"


def theme_css(*, primary: str, background: str) -> str:
    """CSS custom properties for the portal and the agent UI. Inputs are validated '#rrggbb' values only."""
    return (
        ":root{"
        f"--brand-primary:{primary};"
        f"--brand-on-primary:{readable_on(primary)};"
        f"--brand-background:{background};"
        f"--brand-text:{readable_on(background)};"
        "}"
    )


def theme_document(*, operator_slug: str, branding: CleanBranding) -> dict[str, Any]:
    logo = None
    if branding.logo is not None:
        logo = {
            "content_type": branding.logo.content_type,
            "sha256": branding.logo.sha256,
            "data_base64": base64.b64encode(branding.logo.data).decode(),
        }
    return {
        "schema": THEME_SCHEMA,
        "operator": operator_slug,
        "product_name": branding.product_name,
        "support_email": branding.support_email,
        "colors": {
            "primary": branding.primary_color,
            "on_primary": readable_on(branding.primary_color),
            "background": branding.background_color,
            "text": readable_on(branding.background_color),
        },
        "contrast": {"primary_on_background": branding.contrast},
        "logo": logo,
        "css": theme_css(primary=branding.primary_color, background=branding.background_color),
    }


def theme_bytes(document: dict[str, Any]) -> bytes:
    # The runtime drivers write exactly these bytes (same call), so their returned hash must match.
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def theme_hash(document: dict[str, Any]) -> str:
    return hashlib.sha256(theme_bytes(document)).hexdigest()
