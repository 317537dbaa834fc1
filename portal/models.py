"""Which Django users belong to which operator, with what role, and who has been invited to join.

No business rules here: ``portal.services`` writes these rows, ``portal.selectors`` reads them.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from tenants.models import Operator

from .choices import ACTING_ROLES, MembershipRole


class OperatorMembership(models.Model):
    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="operator_memberships")
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=MembershipRole.choices, default=MembershipRole.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["operator", "user"]
        constraints = [models.UniqueConstraint(fields=["user", "operator"], name="one_membership_per_operator")]

    def __str__(self) -> str:
        return f"{self.user} @ {self.operator.slug} ({self.role})"

    @property
    def is_admin(self) -> bool:
        return self.role == MembershipRole.ADMIN

    @property
    def can_act(self) -> bool:
        return self.role in ACTING_ROLES


class OperatorInvitation(models.Model):
    """An invitation by email to join an operator's team. Only the SHA-256 of the link's token is stored,
    so a database reader cannot accept an invitation; the token itself exists only in the mail sent."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(max_length=254)
    role = models.CharField(max_length=20, choices=MembershipRole.choices, default=MembershipRole.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["operator", "email"])]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.operator_id} ({self.role})"
