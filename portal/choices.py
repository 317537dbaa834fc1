"""Roles of an operator's portal users."""

from __future__ import annotations

from django.db import models


class MembershipRole(models.TextChoices):
    ADMIN = "admin", "Admin (also API tokens and branding)"
    MEMBER = "member", "Member (customers and credentials)"
