"""Named purposes and statuses of vault keys and credentials."""

from __future__ import annotations

from django.db import models


class KeyPurpose(models.TextChoices):
    CREDENTIALS = "credentials"
    OBJECTS = "objects"


class KeyStatus(models.TextChoices):
    ACTIVE = "active"
    RETIRED = "retired"


# Credentials the control plane itself creates for a tenant (not operator-managed).
SYSTEM_CREDENTIAL_PREFIX = "system."
DB_PASSWORD_CREDENTIAL = "system.db-password"
INSTANCE_TOKEN_CREDENTIAL = "system.instance-token"
