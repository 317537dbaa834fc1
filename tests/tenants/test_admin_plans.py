"""Plans in the Django admin: staff add them and retire them; the slug is fixed once saved; none is deleted."""

from __future__ import annotations

import pytest

from controlplane.errors import ValidationFailed
from tenants.models import Plan
from tenants.services import plan_for_new_tenant

pytestmark = pytest.mark.django_db

URL = "/admin/tenants/plan/"


def _form(**changes: object) -> dict[str, object]:
    data: dict[str, object] = {"slug": "growth", "name": "Growth", "description": "For a growing shop.",
                               "is_active": "on", "max_messages_per_day": "5000", "max_tasks_per_day": "500"}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_superuser_lists_and_adds_a_plan_that_new_tenants_can_then_pick(admin_client):
    listing = admin_client.get(URL)
    assert listing.status_code == 200 and "standard" in listing.content.decode()  # seeded by the migration
    add = admin_client.get(f"{URL}add/")
    assert add.status_code == 200 and 'name="slug"' in add.content.decode()
    resp = admin_client.post(f"{URL}add/", _form())
    assert resp.status_code == 302, resp.content.decode()[:2000]
    plan = Plan.objects.get(slug="growth")
    assert (plan.name, plan.is_active, plan.max_messages_per_day, plan.max_tasks_per_day) == ("Growth", True, 5000, 500)
    assert plan_for_new_tenant("growth") == plan


def test_the_slug_is_read_only_after_creation_and_unticking_active_retires_the_plan(admin_client):
    plan = Plan.objects.create(slug="growth", name="Growth")
    change = admin_client.get(f"{URL}{plan.pk}/change/").content.decode()
    assert 'name="slug"' not in change and "growth" in change
    resp = admin_client.post(f"{URL}{plan.pk}/change/", _form(slug="renamed", is_active=None, max_tasks_per_day=""))
    assert resp.status_code == 302, resp.content.decode()[:2000]
    plan.refresh_from_db()
    assert plan.slug == "growth" and not plan.is_active and plan.max_tasks_per_day is None
    assert not Plan.objects.filter(slug="renamed").exists()
    with pytest.raises(ValidationFailed, match="not offered"):
        plan_for_new_tenant("growth")


def test_a_plan_cannot_be_deleted_from_the_admin(admin_client):
    plan = Plan.objects.create(slug="growth", name="Growth")
    assert admin_client.get(f"{URL}{plan.pk}/delete/").status_code == 403
    assert admin_client.post(f"{URL}{plan.pk}/delete/", {"post": "yes"}).status_code == 403
    listing = admin_client.get(URL).content.decode()
    assert "delete_selected" not in listing and f'href="{URL}{plan.pk}/delete/"' not in listing
    admin_client.post(URL, {"action": "delete_selected", "_selected_action": [plan.pk], "post": "yes"})
    assert Plan.objects.filter(pk=plan.pk).exists()
