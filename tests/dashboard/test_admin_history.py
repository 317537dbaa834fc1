"""Issue 17 (staff screens): history-like records are read-only in the admin, and the admin says whose it is."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

HISTORY = ["branding/theme", "branding/brandingrevision", "branding/rolloutjob", "branding/brandingdeployment",
           "provisioning/recoveryevent"]


def test_history_models_are_listed_but_cannot_be_added_changed_or_deleted(admin_client):
    index = admin_client.get("/admin/").content.decode()
    assert "Agent control plane: administration" in index and "Django administration" not in index
    for model in HISTORY:
        listing = admin_client.get(f"/admin/{model}/")
        assert listing.status_code == 200, model
        assert admin_client.get(f"/admin/{model}/add/").status_code == 403, model
        assert f'href="/admin/{model}/add/"' not in listing.content.decode(), model
