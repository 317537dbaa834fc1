"""Issue 17: every problem ``type`` the API answers with resolves to a page the product serves."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from controlplane.errors import ApplicationError
from controlplane.problem_types import PROBLEM_TYPES
from controlplane.problems import _DRF_TITLES, TYPE_BASE
from tests.conftest import BASE_DIR

pytestmark = pytest.mark.django_db


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def _slugs_in_code() -> set[str]:
    import connections.oauth  # noqa: F401 - modules that define ApplicationErrors
    import instances.client  # noqa: F401
    import provisioning.recovery.steps  # noqa: F401
    import tenants.services  # noqa: F401
    import vault.rotation  # noqa: F401

    slugs = {c.type_slug for c in _subclasses(ApplicationError) if isinstance(c.__dict__.get("type_slug"), str)}
    slugs |= {slug for slug, _ in _DRF_TITLES.values()} | {"error", "internal-error", "bad-request"}
    for path in (BASE_DIR / "controlplane").glob("*.py"):
        slugs |= set(re.findall(r'TYPE_BASE \+ "([a-z-]+)"', path.read_text()))
    # The instance's own codes come back through the control plane as types (instances.client).
    for path in (BASE_DIR / "agent_runtime" / "host").glob("*.py"):
        slugs |= {code.replace("_", "-") for code in re.findall(r'ApiError\(\d+, "([a-z_]+)"', path.read_text())}
    return slugs


def test_every_type_the_code_can_answer_with_has_a_page():
    slugs = _slugs_in_code()
    assert {"not-found", "payload-too-large", "not-ready", "idempotency-key-reused", "unknown-kind"} <= slugs
    assert slugs - set(PROBLEM_TYPES) == set()


def test_a_real_problem_links_to_its_page():
    problem = Client().get("/api/v1/tenants").json()
    assert problem["type"] == TYPE_BASE + "unauthenticated" == "/problems/unauthenticated"
    page = Client().get(problem["type"])
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    assert PROBLEM_TYPES["unauthenticated"].title in html
    # Backticked names are shown as code, escaped like everything else (no raw backticks, no raw <token>).
    assert "<code>Authorization: Bearer &lt;token&gt;</code>" in html and "`" not in html.split("<main", 1)[-1]
    index = Client().get("/problems/").content.decode()
    assert all(f'href="/problems/{slug}"' in index for slug in PROBLEM_TYPES)
    assert Client().get("/problems/no-such-type").status_code == 404
