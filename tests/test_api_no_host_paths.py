"""Issue 32: no host path in any API answer or event (docs/api.md, "No internals in answers").

A tenant is given every place a path used to reach an answer: its object store named by a ``file://`` URL under
``LOCAL_OBJECTSTORE_ROOT``, a status reason and a recovery naming files under the var root, a release whose
rollout failed with the install's error under ``RELEASES_ROOT/envs/<hex>/``, a webhook event and delivery error
naming them, and an instance whose task error and effect carry the release's path. Then every GET route of the
operator API is called (ids filled in from that world); the ``api`` client (tests/conftest.py) fails on any
answer that names one of the roots, and each planted place is checked to still say what it means.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from controlplane.hostpaths import scrub_host_paths
from instances.client import forget_tenant
from provisioning.models import ProvisionedResource, RecoveryEvent
from releases.choices import ItemStatus, RolloutStatus
from releases.models import AgentRelease, DefaultRelease, ReleaseAssignment, Rollout, RolloutItem
from tenants.actors import SYSTEM
from tenants.models import Tenant
from webhooks.choices import EventType
from webhooks.models import Event, WebhookDelivery
from webhooks.services import endpoint_create, event_record

from .conftest import assert_no_host_path, host_path_roots
from .conversation_helpers import stub_tenant

pytestmark = pytest.mark.django_db

HEX = "cd" * 32


def _api_get_routes() -> list[str]:
    """Every GET-able route under /api/v1/, as a template with ``<name>`` placeholders."""
    routes: list[str] = []

    def walk(patterns: list[URLPattern | URLResolver], prefix: str) -> None:
        for pattern in patterns:
            here = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, here)
            elif here.startswith("api/v1/"):
                view = getattr(pattern.callback, "view_class", None)
                if view is not None and hasattr(view, "get"):
                    routes.append(here)

    walk(get_resolver().url_patterns, "")
    return sorted(set(routes))


def _fill(route: str, ids: dict[str, str]) -> str | None:
    names = re.findall(r"<(?:\w+:)?(\w+)>", route)
    if any(name not in ids for name in names):
        return None
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: ids[m.group(1)], route)


def test_no_answer_of_the_operator_api_names_a_host_path(api) -> None:  # type: ignore[no-untyped-def]
    operator = api.operator
    tenant, stub = stub_tenant(operator)
    env = Path(settings.RELEASES_ROOT) / "envs" / HEX
    prefix = Path(settings.LOCAL_OBJECTSTORE_ROOT) / "tenants" / str(tenant.pk)
    ProvisionedResource.objects.create(tenant=tenant, kind="objectstore", driver="local-fs",
                                       external_id=prefix.as_uri() + "/", status="ready",
                                       details={"url": prefix.as_uri() + "/", "prefix": f"tenants/{tenant.pk}/"})
    ProvisionedResource.objects.create(tenant=tenant, kind="volume", driver="local",
                                       external_id=str(Path(settings.LOCAL_VOLUME_ROOT) / "t_x"), status="ready")
    Tenant.objects.filter(pk=tenant.pk).update(
        status_reason=f"runtime failed: {env}/lib/python3.12/site-packages/agent.py is missing")
    RecoveryEvent.objects.create(tenant=tenant, instance=tenant.instance, reason="crash", detected_at=timezone.now(),
                                 detail=f"exit 1; see {Path(settings.VAR_DIR) / 'log' / 'instance.log'}")
    release = AgentRelease.objects.create(operator=operator, version="2.0.0", distribution="greeter-agent",
                                          digest=f"sha256:{HEX}", filename="g.whl", size_bytes=1,
                                          artifact_key=f"wheels/{operator.pk}/{HEX}.whl", kinds={"greeter": "hi"})
    DefaultRelease.objects.create(operator=operator, release=release)
    ReleaseAssignment.objects.create(tenant=tenant, release=release)
    rollout = Rollout.objects.create(operator=operator, release=release, status=RolloutStatus.ROLLED_BACK, canary=1,
                                     wave_size=1, soak_s=0, reason=f"wave 1 failed: {env}/bin/python: not found")
    RolloutItem.objects.create(rollout=rollout, tenant=tenant, wave=1, status=ItemStatus.FAILED,
                               error=f"install failed: {env}/lib/python3.12/site-packages/greeter/__init__.py")
    endpoint = endpoint_create(operator=operator, url="https://93.184.216.34/h", actor=SYSTEM).endpoint
    event = event_record(operator_id=operator.pk, tenant=tenant, type=EventType.RECOVERY_STARTED,
                         data={"recovery": "1", "reason": f"{env} was removed", "object": prefix.as_uri()})
    WebhookDelivery.objects.filter(event=event).update(last_error=f"could not read {env}/secret")
    task_id = str(uuid.uuid4())
    stub.tasks[task_id] = {"id": task_id, "kind": "greeter", "status": "failed", "blocked_reason": None,
                         "blocked_detail": f"ValueError at {env}/lib/python3.12/site-packages/greeter/steps.py:12",
                         "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}
    stub.add_effect(task_id, state="in_doubt")
    forget_tenant(str(tenant.pk))

    ids = {"tenant_id": str(tenant.pk), "release_id": str(release.pk), "rollout_id": str(rollout.pk),
           "event_id": event.pk, "endpoint_id": str(endpoint.pk), "task_id": task_id, "thread": "main",
           "name": "smtp-password"}
    answered: dict[str, int] = {}
    for route in _api_get_routes():
        path = _fill(route, ids)
        if path is None:
            continue
        answered[path] = api.get(path).status_code  # the client fails on a host path in any answer
    ok = {path for path, code in answered.items() if code == 200}
    for must in ("/api/v1/tenants", f"/api/v1/tenants/{tenant.pk}", f"/api/v1/tenants/{tenant.pk}/recoveries",
                 "/api/v1/rollouts", f"/api/v1/rollouts/{rollout.pk}", "/api/v1/events", f"/api/v1/events/{event.pk}",
                 f"/api/v1/webhook-endpoints/{endpoint.pk}/deliveries", f"/api/v1/tenants/{tenant.pk}/tasks",
                 f"/api/v1/tenants/{tenant.pk}/tasks/{task_id}", f"/api/v1/tenants/{tenant.pk}/effects"):
        assert must in ok, answered

    # What each planted place says instead: names that are not paths, still telling what went wrong where.
    resources = {r["kind"]: r["external_id"] for r in api.get(f"/api/v1/tenants/{tenant.pk}").json()["resources"]}
    assert resources["objectstore"] == f"tenants/{tenant.pk}/" and resources["volume"] == "t_x"
    item = api.get(f"/api/v1/rollouts/{rollout.pk}").json()["items"][0]
    assert item["error"] == f"install failed: release:sha256:{HEX}/lib/python3.12/site-packages/greeter/__init__.py"
    task = api.get(f"/api/v1/tenants/{tenant.pk}/tasks/{task_id}").json()["task"]
    assert task["blocked_detail"].startswith(f"ValueError at release:sha256:{HEX}/lib/")
    # The event as stored (what a webhook carries) names no root either.
    stored = str(Event.objects.get(pk=event.pk).data)
    assert not any(root in stored for root in host_path_roots()), stored
    assert f"objectstore://tenants/{tenant.pk}" in stored


def test_the_scan_itself_fails_on_a_host_path(api) -> None:  # type: ignore[no-untyped-def]
    """The conftest scan can fail: an answer carrying the releases' root is caught, in its JSON-escaped form too."""

    class Answer:
        streaming = False
        request = {"REQUEST_METHOD": "GET", "PATH_INFO": "/api/v1/x"}

        def __init__(self, body: str) -> None:
            self.content = body.encode()

    with pytest.raises(AssertionError, match="host path"):
        assert_no_host_path(Answer(f'{{"error": "{settings.RELEASES_ROOT}/envs/{HEX}"}}'))
    with pytest.raises(AssertionError, match="host path"):
        assert_no_host_path(Answer('{"url": "' + str(settings.LOCAL_OBJECTSTORE_ROOT).replace("/", "\\/") + '"}'))
    assert_no_host_path(Answer(f'{{"error": "release:sha256:{HEX}"}}'))


def test_each_root_gets_a_name_that_is_not_a_path() -> None:
    """The names ``scrub_host_paths`` gives, plain and ``file://`` forms alike; a sibling directory whose name
    merely starts like a root is left alone, and text naming no root is unchanged."""
    releases, objects = Path(settings.RELEASES_ROOT), Path(settings.LOCAL_OBJECTSTORE_ROOT)
    var, volumes = Path(settings.VAR_DIR), Path(settings.LOCAL_VOLUME_ROOT)
    said = scrub_host_paths(f"boom in {releases}/envs/{HEX}/lib/x.py: no")
    assert said == f"boom in release:sha256:{HEX}/lib/x.py: no"
    assert scrub_host_paths(f"'{releases}/wheels/op-1/{HEX}.whl' missing") == f"'wheel:sha256:{HEX}' missing"
    assert scrub_host_paths((objects / "tenants" / "t1").as_uri() + "/") == "objectstore://tenants/t1/"
    assert scrub_host_paths(f"{volumes}/t_1 is gone") == "volume:t_1 is gone"
    assert scrub_host_paths(f"{var}/log/worker.log") == "var:log/worker.log"
    assert scrub_host_paths(f"{var}iants/x") == f"{var}iants/x"
    assert scrub_host_paths("/tmp/elsewhere and s3://bucket/tenants/t1/") == "/tmp/elsewhere and s3://bucket/tenants/t1/"
