"""Which Django users belong to which operator, and with what role. Nothing else lives here."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from tenants.models import Operator

from .choices import MembershipRole


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
