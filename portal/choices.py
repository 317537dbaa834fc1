"""Roles of an operator's portal users, and what each may do. No logic beyond these tables."""

from __future__ import annotations

from django.db import models


class MembershipRole(models.TextChoices):
    ADMIN = "admin", "Admin (also API tokens, branding and the team)"
    MEMBER = "member", "Member (customers and credentials)"
    VIEWER = "viewer", "Viewer (read only)"


# Roles that may change a customer (onboard, credentials, suspend, resume, restart); viewers only look.
ACTING_ROLES: frozenset[str] = frozenset({MembershipRole.ADMIN, MembershipRole.MEMBER})
# Deprovisioning cannot be undone, so it is kept to the same people who manage tokens and the team.
DEPROVISION_ROLES: frozenset[str] = frozenset({MembershipRole.ADMIN})

# How long an invitation link works, unless PORTAL_INVITATION_TTL_S says otherwise.
INVITATION_TTL_DEFAULT_S = 7 * 24 * 3600
