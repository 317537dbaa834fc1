"""Reads of an operator's releases. Another operator's release does not exist (404), like a missing one."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet

from controlplane.errors import NotFound
from tenants.models import Operator, Tenant

from .models import AgentRelease, DefaultRelease, ReleaseAssignment, Rollout

__all__ = ["retained_release_spec",
           "release_list", "release_get", "release_env_dir", "tenant_release_spec", "rollout_list", "rollout_get",
           "operator_default_release_version"]


def release_env_dir(digest: str) -> Path:
    """Where the release with this digest is installed (shared by every release with the same bytes)."""
    return Path(settings.RELEASES_ROOT) / "envs" / digest.removeprefix("sha256:")


def tenant_release_spec(tenant_id: object) -> dict[str, str]:
    """What the tenant's instance must load (``TenantSpec.release``), its declared kinds included; empty: the
    runtime's installed agents.

    A wheel's ``env`` is its install directory and ``image`` is empty; an image's ``image`` is its digest-pinned
    reference and ``env`` is empty (nothing of it is installed here). Each runtime driver refuses the other kind.
    """
    row = (ReleaseAssignment.objects.filter(tenant_id=tenant_id, release__isnull=False)
           .values_list("release__version", "release__digest", "release__image", "retained", "release__kinds")
           .first())
    if row is None:
        return {}
    version, digest, image, retained, kinds = row
    # ``kinds``: what the probe read at upload, comma-separated; the instance imports only those (issue 39).
    spec = {"version": version, "digest": digest, "image": image,
            "env": "" if image else str(release_env_dir(digest)), "kinds": ",".join(sorted(kinds or {}))}
    if not image and retained:
        spec["retained"] = retained_release_spec(retained)
    return spec


def tenant_release_connections(tenant: Tenant) -> frozenset[str] | None:
    """The providers the agents of the release the tenant's instance runs declare (``Agent(connections=...)``);
    None when it runs no release (the runtime's installed agents: nothing was declared to check against)."""
    row = (ReleaseAssignment.objects.filter(tenant=tenant, release__isnull=False)
           .values_list("release__connections", flat=True).first())
    return None if row is None else frozenset(row or ())


def retained_release_spec(release_ids: list[str]) -> str:
    """The earlier wheel releases the instance keeps loadable, as JSON ``[{version, digest, env}]`` newest first
    (a string: ``TenantSpec.release`` maps names to strings); ``""`` stands for the runtime's own agents (all
    empty). Image releases are left out: a pod runs one image."""
    rows = {str(r.pk): r for r in AgentRelease.objects.filter(pk__in=[i for i in release_ids if i], image="")}
    out = []
    for i in release_ids:
        if not i:
            out.append({"version": "", "digest": "", "env": ""})
        elif i in rows:
            out.append({"version": rows[i].version, "digest": rows[i].digest,
                        "env": str(release_env_dir(rows[i].digest))})
    return json.dumps(out)


def operator_default_release_version(operator: Operator) -> str | None:
    """The version of the release the operator's new customers start on; None when it has no default."""
    return (DefaultRelease.objects.filter(operator=operator, release__isnull=False)
            .values_list("release__version", flat=True).first())


def release_list(*, operator: Operator) -> QuerySet[AgentRelease]:
    return AgentRelease.objects.filter(operator=operator).order_by("-created_at", "-id")


def release_get(*, operator: Operator, release_id: object) -> AgentRelease:
    try:
        pk = uuid.UUID(str(release_id))
    except ValueError:
        raise NotFound("release not found") from None
    release = release_list(operator=operator).filter(pk=pk).first()
    if release is None:
        raise NotFound("release not found")
    return release


def rollout_list(*, operator: Operator | None) -> QuerySet[Rollout]:
    """An operator's rollouts, newest first (``None``: every operator's, for staff)."""
    rollouts = Rollout.objects.select_related("release", "operator").order_by("-created_at", "-id")
    return rollouts if operator is None else rollouts.filter(operator=operator)


def rollout_get(*, operator: Operator, rollout_id: object) -> Rollout:
    try:
        pk = uuid.UUID(str(rollout_id))
    except ValueError:
        raise NotFound("rollout not found") from None
    rollout = rollout_list(operator=operator).filter(pk=pk).first()
    if rollout is None:
        raise NotFound("rollout not found")
    return rollout
