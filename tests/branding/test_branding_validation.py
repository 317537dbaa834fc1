"""Branding bad input: hostile SVGs, oversized and disguised images, unreadable colours, HTML in names.

Each is refused or neutralized, with a message that says what and why; through the validator,
through the Celery job's service, and through the portal form.
"""

from __future__ import annotations

import base64
import io

import pytest
from django.contrib.auth.models import User
from django.test import Client
from PIL import Image

from branding.choices import RevisionStatus
from branding.models import BrandingAsset, BrandingRevision, Theme
from branding.render import theme_document, theme_hash
from branding.services import branding_revision_process, branding_submit
from branding.validation import branding_validate, clean_logo, contrast_ratio, sanitize_svg
from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.models import Operator
from tenants.services import operator_create

LOW_PRIMARY = "#d2d2d2"  # on white: 1.5:1
SVG_SCRIPT = b"""<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10">
<script>alert(document.cookie)</script><rect width="10" height="10" fill="#123456"/></svg>"""
SVG_ONLOAD = b"""<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><circle r="4" onclick="x()"/></svg>"""
SVG_EXTERNAL = b"""<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">
<use xlink:href="https://evil.example/sprite.svg#a"/><use href="#local"/>
<rect style="fill:url(https://evil.example/x.png)" width="1" height="1"/>
<foreignObject><div xmlns="http://www.w3.org/1999/xhtml">hi</div></foreignObject>
<a href="javascript:alert(1)"><text>x</text></a><image href="https://evil.example/t.png"/></svg>"""
SVG_ENTITIES = b"""<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<svg xmlns="http://www.w3.org/2000/svg"><text>&x;</text></svg>"""


def _png(size: tuple[int, int] = (4, 4)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (10, 80, 160)).save(out, format="PNG")
    return out.getvalue()


def _valid(**overrides):
    values = {"product_name": "Alpha Agent", "primary_color": "#1f4b99", "background_color": "#ffffff",
              "support_email": "help@alpha.example", "logo": None}
    values.update(overrides)
    return branding_validate(**values)


# --- the validator ---------------------------------------------------------------------------------------


def test_svg_script_is_removed_and_reported():
    clean, errors, warnings = sanitize_svg(SVG_SCRIPT)
    assert not errors and clean is not None
    assert b"script" not in clean.lower() and b"alert" not in clean
    assert b"<rect" in clean
    assert "<script> element" in warnings[0] and "Removed from the SVG logo" in warnings[0]


def test_svg_event_handlers_are_removed_and_reported():
    clean, errors, warnings = sanitize_svg(SVG_ONLOAD)
    assert clean is not None and not errors
    assert b"onload" not in clean and b"onclick" not in clean and b"alert" not in clean
    assert "onload attribute (event handler)" in warnings[0] and "onclick" in warnings[0]


def test_svg_external_references_are_removed():
    clean, _, warnings = sanitize_svg(SVG_EXTERNAL)
    assert clean is not None
    for bad in (b"evil.example", b"javascript", b"foreignObject", b"<image", b"<a "):
        assert bad not in clean, bad
    assert b'href="#local"' in clean  # an internal reference stays
    assert "external reference" in warnings[0]


def test_svg_with_a_dtd_or_entities_is_refused():
    clean, errors, _ = sanitize_svg(SVG_ENTITIES)
    assert clean is None and "DTD or entities" in errors[0]
    report = _valid(logo=SVG_ENTITIES)
    assert not report.ok and report.messages_for("logo")


def test_a_50_mb_image_is_refused_with_its_size_and_the_limit():
    huge = b"\x89PNG\r\n\x1a\n" + b"\0" * (50 * 1024 * 1024)
    clean, errors, _ = clean_logo(huge)
    assert clean is None
    assert "50.0 MB" in errors[0] and "256 KB" in errors[0]


def test_images_are_typed_by_content_not_name():
    assert clean_logo(_png())[0].content_type == "image/png"
    assert "none of those" in clean_logo(b"MZ\x90\x00 this is an exe")[1][0]
    assert "could not be read" in clean_logo(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)[1][0]
    assert "pixels" in clean_logo(_png((3000, 10)))[1][0]


def test_a_low_contrast_pair_is_refused_with_ratio_threshold_and_a_suggestion():
    assert round(contrast_ratio("#000000", "#ffffff"), 1) == 21.0
    assert round(contrast_ratio("#a0a0a0", "#ffffff"), 1) == pytest.approx(2.6, abs=0.1)
    report = _valid(primary_color="#bcbcbc", background_color="#ffffff")  # 1.9:1
    message = report.messages_for("primary_color")[0]
    assert "1.9:1" in message and "4.5:1" in message and "Try #" in message
    suggestion = message.split("Try ")[1][:7]
    assert contrast_ratio(suggestion, "#ffffff") >= 4.5
    assert _valid(primary_color="nope").messages_for("primary_color") == [
        "The primary colour must be a hex colour like #1f4b99."]


def test_exact_1_5_to_1_pair_is_refused():
    ratio = contrast_ratio(LOW_PRIMARY, "#ffffff")
    assert 1.48 <= ratio <= 1.52
    report = _valid(primary_color=LOW_PRIMARY, background_color="#ffffff")
    assert not report.ok and "1.5:1" in report.messages_for("primary_color")[0]


def test_html_in_the_product_name_is_neutralized_with_a_warning():
    report = _valid(product_name='<b>Alpha</b> <img src=x onerror=alert(1)>Agent<script>x</script>')
    assert report.ok
    assert "<" not in report.clean.product_name and ">" not in report.clean.product_name
    assert report.clean.product_name.startswith("Alpha")
    assert any("HTML was removed" in w.message for w in report.warnings)
    assert _valid(product_name="<b></b>").messages_for("product_name")


def test_theme_hash_is_stable_and_content_addressed():
    a = theme_document(operator_slug="op", branding=_valid().clean)
    b = theme_document(operator_slug="op", branding=_valid().clean)
    c = theme_document(operator_slug="op", branding=_valid(primary_color="#123456").clean)
    assert theme_hash(a) == theme_hash(b) != theme_hash(c)
    assert a["colors"]["on_primary"] == "#ffffff" and a["css"].startswith(":root{--brand-primary:#1f4b99")


# --- through the job's service and the portal ----------------------------------------------------------


@pytest.fixture
def op(db) -> Operator:
    return operator_create(slug="op-brand", name="Brand Op", actor=SYSTEM, domains=["brand.localhost"])


@pytest.fixture
def admin_client(op) -> Client:
    user = User.objects.create_user("brand-admin", password="pw-long-enough-1")
    OperatorMembership.objects.create(user=user, operator=op, role="admin")
    client = Client(HTTP_HOST="brand.localhost")
    client.force_login(user)
    return client


def _submit(op, **overrides) -> BrandingRevision:
    values = {"product_name": "Brand Agent", "primary_color": "#1f4b99", "background_color": "#ffffff",
              "support_email": "help@brand.example", "logo": None}
    values.update(overrides)
    revision = branding_submit(operator=op, actor=SYSTEM, **values)
    branding_revision_process(str(revision.pk))
    revision.refresh_from_db()
    return revision


@pytest.mark.django_db
def test_job_publishes_a_sanitized_svg_and_reports_what_it_removed(op):
    revision = _submit(op, logo=SVG_SCRIPT)
    assert revision.status == RevisionStatus.PUBLISHED
    assert "<script> element" in revision.warnings[0]["message"]
    asset = BrandingAsset.objects.get(pk=revision.theme.logo_id)
    assert b"script" not in bytes(asset.data)
    assert b"script" not in base64.b64decode(revision.theme.document["logo"]["data_base64"])
    assert revision.raw_logo is None  # the raw upload is not kept


@pytest.mark.django_db
def test_job_rejects_bad_colours_and_publishes_nothing(op):
    revision = _submit(op, primary_color=LOW_PRIMARY, background_color="#ffffff")
    assert revision.status == RevisionStatus.REJECTED
    assert "1.5:1" in revision.errors[0]["message"]
    assert not Theme.objects.filter(operator=op).exists()
    op.refresh_from_db()
    assert op.primary_color == "#1f4b99"  # unchanged


@pytest.mark.django_db
def test_job_neutralizes_html_in_the_product_name(op):
    revision = _submit(op, product_name="<script>alert(1)</script>Brand <b>Agent</b>")
    assert revision.status == RevisionStatus.PUBLISHED
    op.refresh_from_db()
    assert op.product_name == "alert(1)Brand Agent"
    assert revision.theme.document["product_name"] == "alert(1)Brand Agent"


@pytest.mark.django_db
def test_portal_refuses_a_50_mb_upload_without_storing_it(op, admin_client):
    huge = io.BytesIO(b"\x89PNG\r\n\x1a\n" + b"\0" * (50 * 1024 * 1024))
    huge.name = "huge.png"
    resp = admin_client.post("/branding/", {"product_name": "Brand", "primary_color": "#1f4b99",
                                            "background_color": "#ffffff", "logo": huge, "action": "publish"})
    assert resp.status_code == 400
    assert "larger than 256 KB" in resp.content.decode()
    assert not BrandingRevision.objects.exists()


@pytest.mark.django_db
def test_portal_preview_shows_contrast_and_errors_live(op, admin_client):
    resp = admin_client.post("/branding/preview", {"product_name": "<i>Brand</i>", "primary_color": LOW_PRIMARY,
                                                   "background_color": "#ffffff"})
    body = resp.content.decode()
    assert resp.status_code == 200
    assert "1.5:1" in body and "below WCAG AA" in body and "<i>Brand" not in body
    ok = admin_client.post("/branding/preview", {"product_name": "Brand", "primary_color": "#1f4b99",
                                                 "background_color": "#ffffff"}).content.decode()
    assert "passes WCAG AA" in ok and "--p-primary:#1f4b99" in ok


@pytest.mark.django_db
def test_portal_shows_the_jobs_rejection_clearly(op, admin_client):
    _submit(op, primary_color=LOW_PRIMARY, background_color="#ffffff")
    body = admin_client.get("/branding/").content.decode()
    assert "Not published" in body and "1.5:1" in body and "4.5:1" in body


@pytest.mark.django_db
def test_portal_submit_queues_a_revision(op, admin_client):
    svg = io.BytesIO(SVG_ONLOAD)
    svg.name = "logo.svg"
    resp = admin_client.post("/branding/", {"product_name": "Brand", "primary_color": "#1f4b99",
                                            "background_color": "#ffffff", "logo": svg, "action": "publish"})
    assert resp.status_code == 302
    revision = BrandingRevision.objects.get(operator=op)
    assert revision.status == RevisionStatus.PENDING and bytes(revision.raw_logo) == SVG_ONLOAD


@pytest.mark.django_db
def test_logo_assets_are_served_with_a_locked_down_policy(op):
    revision = _submit(op, logo=SVG_SCRIPT)
    resp = Client(HTTP_HOST="brand.localhost").get(f"/branding/assets/{revision.theme.logo_id}")
    assert resp.status_code == 200 and resp["Content-Type"] == "image/svg+xml"
    assert "sandbox" in resp["Content-Security-Policy"] and resp["X-Content-Type-Options"] == "nosniff"
    assert Client().get("/branding/assets/" + "0" * 64).status_code == 404
