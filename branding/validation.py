"""Validate and sanitize an operator's branding input: colours (WCAG AA), product name, support email, logo.

Pure functions over values: no database, no files, no network. ``branding_validate`` returns a
report with every problem at once (errors refuse the submission, warnings say what was changed),
so the operator fixes everything in one go.
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree as ET  # noqa: S405 - only used to build/serialize; parsing is defusedxml

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.utils.html import strip_tags

__all__ = [
    "FieldMessage",
    "CleanLogo",
    "CleanBranding",
    "BrandingReport",
    "parse_hex_color",
    "contrast_ratio",
    "readable_on",
    "check_contrast",
    "clean_product_name",
    "clean_logo",
    "sanitize_svg",
    "branding_validate",
    "format_bytes",
]

AA_MIN_CONTRAST = 4.5
_HEX_RE = re.compile(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$")
SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"


@dataclass(frozen=True)
class FieldMessage:
    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


@dataclass(frozen=True)
class CleanLogo:
    content_type: str
    data: bytes = field(repr=False)
    sha256: str = ""
    width: int | None = None
    height: int | None = None


@dataclass(frozen=True)
class CleanBranding:
    product_name: str
    primary_color: str
    background_color: str
    support_email: str
    logo: CleanLogo | None
    contrast: float


@dataclass
class BrandingReport:
    errors: list[FieldMessage] = field(default_factory=list)
    warnings: list[FieldMessage] = field(default_factory=list)
    clean: CleanBranding | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def messages_for(self, name: str) -> list[str]:
        return [m.message for m in self.errors if m.field == name]


def format_bytes(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.1f} MB"
    if n >= 1024:
        return f"{n / 1024:.0f} KB"
    return f"{n} bytes"


# --- colours ---------------------------------------------------------------------------------------


def parse_hex_color(value: object) -> str | None:
    """'#abc' / 'AABBCC' / '#aabbcc' -> '#aabbcc'; anything else -> None."""
    if not isinstance(value, str):
        return None
    match = _HEX_RE.fullmatch(value.strip())
    if match is None:
        return None
    digits = match.group(1).lower()
    if len(digits) == 3:
        digits = "".join(ch * 2 for ch in digits)
    return f"#{digits}"


def _channels(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def _luminance(color: str) -> float:
    def linear(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in _channels(color))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(a: str, b: str) -> float:
    """WCAG 2.x contrast ratio of two '#rrggbb' colours, 1.0 .. 21.0."""
    la, lb = _luminance(a), _luminance(b)
    hi, lo = max(la, lb), min(la, lb)
    return (hi + 0.05) / (lo + 0.05)


def readable_on(background: str) -> str:
    """Near-black or white, whichever reads better on ``background`` (always >= 4.5:1)."""
    dark, light = "#111111", "#ffffff"
    return dark if contrast_ratio(dark, background) >= contrast_ratio(light, background) else light


def _mix(color: str, target: tuple[int, int, int], t: float) -> str:
    return "#" + "".join(f"{round(c + (g - c) * t):02x}" for c, g in zip(_channels(color), target, strict=True))


def _suggest(primary: str, background: str) -> str | None:
    """The closest darker (or lighter) shade of ``primary`` that passes AA on ``background``."""
    target = (0, 0, 0) if _luminance(background) > 0.18 else (255, 255, 255)
    for step in range(1, 21):
        candidate = _mix(primary, target, step / 20)
        if contrast_ratio(candidate, background) >= AA_MIN_CONTRAST:
            return candidate
    return None


def check_contrast(primary: str, background: str) -> tuple[float, str | None]:
    """(ratio, error message or None) for the primary colour used as text/buttons on the background."""
    ratio = contrast_ratio(primary, background)
    if ratio >= AA_MIN_CONTRAST:
        return ratio, None
    message = (
        f"The primary colour {primary} on the background {background} has a contrast of {ratio:.1f}:1; "
        f"WCAG AA needs at least {AA_MIN_CONTRAST}:1 so text and buttons stay readable."
    )
    suggestion = _suggest(primary, background)
    if suggestion:
        message += f" Try {suggestion} ({contrast_ratio(suggestion, background):.1f}:1)."
    return ratio, message


# --- text ------------------------------------------------------------------------------------------


def clean_product_name(value: object) -> tuple[str, list[str], list[str]]:
    """(clean name, errors, warnings). HTML is removed, never interpreted; the name stays plain text."""
    if not isinstance(value, str):
        return "", ["Enter a product name."], []
    warnings: list[str] = []
    stripped = strip_tags(value)
    stripped = stripped.replace("<", "").replace(">", "")
    stripped = " ".join(stripped.split())
    if stripped != " ".join(value.split()):
        warnings.append(f"HTML was removed from the product name; it will be shown as plain text: {stripped!r}.")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in stripped):
        return "", ["The product name must not contain control characters."], warnings
    if not stripped:
        return "", ["Enter a product name (plain text, 1-100 characters)."], warnings
    if len(stripped) > 100:
        return "", [f"The product name is {len(stripped)} characters; the limit is 100."], warnings
    return stripped, [], warnings


# --- logo ------------------------------------------------------------------------------------------

_RASTER_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png", "PNG"),
    (b"\xff\xd8\xff", "image/jpeg", "JPEG"),
)
_SVG_ELEMENTS = frozenset({
    "svg", "g", "defs", "title", "desc", "path", "rect", "circle", "ellipse", "line", "polyline", "polygon",
    "text", "tspan", "linearGradient", "radialGradient", "stop", "clipPath", "mask", "use", "symbol",
})
_EXTERNAL_URL_RE = re.compile(r"url\(\s*['\"]?\s*(?!#)", re.IGNORECASE)
_DANGEROUS_VALUE_RE = re.compile(r"(javascript|vbscript|data)\s*:|expression\s*\(|@import", re.IGNORECASE)


def _sniff(data: bytes) -> tuple[str, str] | None:
    for magic, content_type, label in _RASTER_SIGNATURES:
        if data.startswith(magic):
            return content_type, label
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", "WEBP"
    head = data[:512].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<?xml", b"<svg", b"<!--", b"<!doctype svg")):
        return "image/svg+xml", "SVG"
    return None


def _local(tag: str) -> tuple[str, str]:
    if tag.startswith("{"):
        ns, _, name = tag[1:].partition("}")
        return ns, name
    return "", tag


def sanitize_svg(data: bytes) -> tuple[bytes | None, list[str], list[str]]:
    """(clean SVG bytes or None, errors, warnings). Scripts, event handlers and external references
    are removed and each removal is reported; DTDs, entities and anything unparsable are refused."""
    try:
        root = SafeET.fromstring(data, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException:
        return None, ["The SVG logo declares a DTD or entities, which are not allowed. Export it as plain SVG."], []
    except ET.ParseError as exc:
        return None, [f"The SVG logo is not well-formed XML ({exc}). Export it again or use a PNG."], []
    ns, name = _local(root.tag)
    if name != "svg" or ns not in ("", SVG_NS):
        return None, ["The logo file is XML but not an SVG image."], []
    removed: list[str] = []

    def clean(element: ET.Element) -> None:
        for child in list(element):
            cns, cname = _local(child.tag) if isinstance(child.tag, str) else ("", "")
            if cns not in ("", SVG_NS) or cname not in _SVG_ELEMENTS:
                removed.append(f"<{cname or 'unknown'}> element")
                element.remove(child)
                continue
            clean(child)
        for attr in list(element.attrib):
            ans, aname = _local(attr)
            value = element.attrib[attr]
            if aname.lower().startswith("on"):
                removed.append(f"{aname} attribute (event handler)")
            elif aname == "href" and ans in ("", XLINK_NS) and not value.strip().startswith("#"):
                removed.append(f"href={value[:60]!r} (external reference)")
            elif _EXTERNAL_URL_RE.search(value) or _DANGEROUS_VALUE_RE.search(value):
                removed.append(f"{aname} attribute (external reference or script)")
            elif ans not in ("", XLINK_NS, "http://www.w3.org/XML/1998/namespace"):
                removed.append(f"{aname} attribute (foreign namespace)")
            else:
                continue
            del element.attrib[attr]

    clean(root)
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    out = ET.tostring(root, encoding="utf-8", xml_declaration=False)
    warnings = []
    if removed:
        unique = list(dict.fromkeys(removed))
        warnings.append("Removed from the SVG logo for safety: " + ", ".join(unique[:10])
                        + (f" and {len(unique) - 10} more" if len(unique) > 10 else "") + ".")
    return out, [], warnings


def clean_logo(data: bytes) -> tuple[CleanLogo | None, list[str], list[str]]:
    """(clean logo or None, errors, warnings): type by content (never by file name), size and dimensions."""
    limit = settings.BRANDING_LOGO_MAX_BYTES
    if len(data) > limit:
        return None, [f"The logo is {format_bytes(len(data))}; the limit is {format_bytes(limit)}. "
                      "Use a smaller PNG, JPEG, WebP or SVG file."], []
    if not data:
        return None, ["The logo file is empty."], []
    sniffed = _sniff(data)
    if sniffed is None:
        return None, ["The logo must be a PNG, JPEG, WebP or SVG image; this file is none of those."], []
    content_type, label = sniffed
    if content_type == "image/svg+xml":
        svg, errors, warnings = sanitize_svg(data)
        if svg is None:
            return None, errors, warnings
        return CleanLogo(content_type, svg, hashlib.sha256(svg).hexdigest()), [], warnings
    from PIL import Image, UnidentifiedImageError

    max_side = settings.BRANDING_LOGO_MAX_PIXELS
    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
            detected = probe.format
            if width > max_side or height > max_side:
                return None, [f"The logo is {width}x{height} pixels; the limit is {max_side}x{max_side}."], []
            probe.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None, [f"The logo looks like a {label} file but could not be read as one (damaged?)."], []
    if detected != label:
        return None, [f"The logo's content ({detected}) does not match its signature ({label})."], []
    return CleanLogo(content_type, data, hashlib.sha256(data).hexdigest(), width, height), [], []


# --- everything ------------------------------------------------------------------------------------


def branding_validate(
    *, product_name: object, primary_color: object, background_color: object, support_email: object,
    logo: bytes | None,
) -> BrandingReport:
    report = BrandingReport()
    name, errors, warnings = clean_product_name(product_name)
    report.errors += [FieldMessage("product_name", m) for m in errors]
    report.warnings += [FieldMessage("product_name", m) for m in warnings]

    primary = parse_hex_color(primary_color)
    background = parse_hex_color(background_color)
    if primary is None:
        report.errors.append(FieldMessage("primary_color", "The primary colour must be a hex colour like #1f4b99."))
    if background is None:
        report.errors.append(FieldMessage("background_color",
                                          "The background colour must be a hex colour like #ffffff."))
    ratio = 0.0
    if primary and background:
        ratio, problem = check_contrast(primary, background)
        if problem:
            report.errors.append(FieldMessage("primary_color", problem))

    email = (support_email or "").strip() if isinstance(support_email, str) else ""
    if email:
        try:
            validate_email(email)
        except ValidationError:
            report.errors.append(FieldMessage("support_email", f"{email[:100]!r} is not an email address."))

    clean: CleanLogo | None = None
    if logo is not None:
        clean, errors, warnings = clean_logo(logo)
        report.errors += [FieldMessage("logo", m) for m in errors]
        report.warnings += [FieldMessage("logo", m) for m in warnings]

    if not report.errors:
        report.clean = CleanBranding(
            product_name=name, primary_color=primary or "", background_color=background or "",
            support_email=email, logo=clean, contrast=round(ratio, 2),
        )
    return report


def report_as_json(report: BrandingReport) -> dict[str, Any]:
    return {"errors": [m.as_dict() for m in report.errors], "warnings": [m.as_dict() for m in report.warnings]}
