"""The favicon (issue 37): every page links an icon that loads, and /favicon.ico (which a browser asks for on a
page without a link: the API's JSON, Swagger UI) is an icon too, on the control plane's host and an operator's.

Served by WhiteNoise like every static file: the linked SVG from the apps' static directories, /favicon.ico from
``WHITENOISE_ROOT``. The browser tests fail on any console error, so an icon that 404s fails them as well.
"""

from __future__ import annotations

import io
import re

import pytest
from django.test import Client
from PIL import Image

from branding.services import branding_revision_process, branding_submit
from tenants.actors import SYSTEM
from tenants.services import operator_create

pytestmark = pytest.mark.django_db

HOST = "portal-icon.localhost"


def _icon_href(html: str) -> str:
    links = re.findall(r'<link rel="icon" href="([^"]+)"', html)
    assert len(links) == 1, links
    return links[0]


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("host", ["testserver", HOST])
def test_favicon_ico_at_the_root_is_an_icon_on_every_host(host):
    operator_create(slug="op-icon", name="Icon Reseller", actor=SYSTEM, domains=[HOST])
    resp = Client(HTTP_HOST=host).get("/favicon.ico")
    assert resp.status_code == 200
    assert resp["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon"), resp["Content-Type"]
    body = b"".join(resp.streaming_content) if resp.streaming else resp.content
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO header, not an HTML page that happens to be 200


def test_the_dashboard_links_the_products_icon_and_it_loads():
    client = Client()
    page = client.get("/dashboard/login/")
    assert page.status_code == 200
    href = _icon_href(page.content.decode())
    icon = client.get(href)
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content)


def test_the_portal_links_the_operators_logo_as_its_icon_else_the_products():
    operator = operator_create(slug="op-icon", name="Icon Reseller", actor=SYSTEM, domains=[HOST])
    client = Client(HTTP_HOST=HOST)
    plain = _icon_href(client.get("/login/").content.decode())
    assert plain.endswith("favicon.svg") and client.get(plain).status_code == 200

    revision = branding_submit(operator=operator, actor=SYSTEM, product_name="Icon Co", primary_color="#1f4b99",
                               background_color="#ffffff", logo=_png())
    assert branding_revision_process(str(revision.pk)) == "published"
    branded = _icon_href(client.get("/login/").content.decode())
    assert branded != plain
    logo = client.get(branded)
    assert logo.status_code == 200 and logo["Content-Type"] == "image/png"
