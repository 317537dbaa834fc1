"""An operator admin invites a colleague by email from the Team page; the colleague opens the mailed link in
another browser, creates an account and lands in the portal; a second use of the link is refused.

Mail goes through Django's configured backend (pytest-django's locmem outbox: the live server runs in
this process), so the link is exactly the one in the mail, on the operator's own host.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.core import mail
from playwright.sync_api import expect

from portal.models import OperatorMembership
from tenants.actors import SYSTEM
from tenants.services import operator_create

from .conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct horse battery staple"
HOST = "portal-team.localhost"


def test_admin_invites_a_colleague_who_joins_from_the_mailed_link(chromium, page, live_port):
    operator = operator_create(slug="teamco", name="Teamco", actor=SYSTEM, domains=[HOST])
    admin = User.objects.create_user("tess", password=PASSWORD)
    OperatorMembership.objects.create(user=admin, operator=operator, role="admin")

    page.goto(f"http://{HOST}:{live_port}/team/")
    page.get_by_label("Username").fill("tess")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Team", exact=True)).to_be_visible()
    page.get_by_label("Email address").fill("colleague@teamco.example")
    page.get_by_label("Role").select_option("viewer")
    page.get_by_role("button", name="Send invitation").click()
    expect(page.get_by_role("status")).to_contain_text("Invitation mailed to colleague@teamco.example")
    expect(page.get_by_test_id("invitations")).to_contain_text("colleague@teamco.example")
    screenshot(page, "portal-team")

    assert len(mail.outbox) == 1
    link = re.search(r"http://\S+/invitations/\S+/", mail.outbox[0].body).group(0)
    assert link.startswith(f"http://{HOST}:{live_port}/invitations/")  # the host (and port) it was sent from

    other = chromium.new_context(viewport={"width": 1280, "height": 860})
    try:
        guest = other.new_page()
        guest.goto(link)
        expect(guest).to_have_url(re.compile(r"/invitations/accept/$"))  # the token left the address bar
        expect(guest.get_by_role("heading", name="Join Teamco")).to_be_visible()
        guest.get_by_label("Username").fill("colin")
        guest.get_by_label("Password", exact=True).fill("a long enough passphrase")
        guest.get_by_label("Password again").fill("a long enough passphrase")
        screenshot(guest, "portal-invitation-accept")
        guest.get_by_role("button", name="Create account and join").click()
        expect(guest.get_by_role("heading", name="Customers", exact=True)).to_be_visible()
        expect(guest.get_by_role("status")).to_contain_text("Welcome to Teamco's team, colin")
        expect(guest.get_by_role("navigation", name="Portal").get_by_role("link", name="Team")).to_have_count(0)

        again = other.new_page()
        again.goto(link)
        expect(again.get_by_test_id("invitation-refused")).to_contain_text("already been used")
    finally:
        other.close()
    assert OperatorMembership.objects.get(user__username="colin", operator=operator).role == "viewer"
