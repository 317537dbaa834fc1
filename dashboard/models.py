"""Per-action permissions of the staff dashboard (no table: a holder for the permission rows).

Viewing needs ``is_staff``; each action needs its own permission below (superusers have all).
Grant them to a group such as "on-call" in the Django admin.
"""

from __future__ import annotations

from django.db import models


class DashboardPermissions(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("retry_workflow", "Can retry a failed workflow step"),
            ("restart_instance", "Can restart an agent instance"),
            ("kill_instance", "Can kill an agent instance"),
            ("suspend_tenant", "Can suspend or resume a tenant"),
            ("deprovision_tenant", "Can deprovision a tenant"),
            ("rotate_keys", "Can rotate a tenant's data keys"),
            ("talk_to_agent", "Can send messages to a tenant's agent"),
            ("decide_effect", "Can decide an effect in doubt (performed, not performed, perform now)"),
        ]

    def __str__(self) -> str:
        return "dashboard permissions"
