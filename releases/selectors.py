"""Reads of an operator's releases. Another operator's release does not exist (404), like a missing one."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from controlplane.errors import NotFound
from tenants.models import Operator

from .models import AgentRelease

__all__ = ["release_list", "release_get"]


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
