"""Named purposes and statuses of vault keys and credentials."""

from __future__ import annotations

from django.db import models


class KeyPurpose(models.TextChoices):
    CREDENTIALS = "credentials"
    OBJECTS = "objects"


class KeyStatus(models.TextChoices):
    ACTIVE = "active"
    RETIRED = "retired"  # no longer encrypts; still opens what it sealed
    DESTROYED = "destroyed"  # wrapped bytes erased (crypto-shredding): nothing opens what it sealed


class ArchiveState(models.TextChoices):
    """Where a sealed archive is in its life. Only ``deleted`` says the object is gone for sure."""

    STORED = "stored"
    DELETING = "deleting"  # expired; its deletion from the store has started and may not have finished
    DELETED = "deleted"


# States in which the archive may still exist in the store, so its key version must stay.
ARCHIVE_MAY_EXIST = (ArchiveState.STORED, ArchiveState.DELETING)


# Credentials the control plane itself creates for a tenant (not operator-managed).
SYSTEM_CREDENTIAL_PREFIX = "system."
DB_PASSWORD_CREDENTIAL = "system.db-password"
INSTANCE_TOKEN_CREDENTIAL = "system.instance-token"


class RotationKind(models.TextChoices):
    KEK = "kek", "Key-encryption key (re-wrap data keys)"
    DATA_KEY = "data_key", "Tenant data key (re-encrypt credentials)"


class RotationStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


ACTIVE_ROTATION_STATUSES = (RotationStatus.PENDING, RotationStatus.RUNNING)


class CredentialState(models.TextChoices):
    ACTIVE = "active"
    REVOKED = "revoked"
    CONSUMED = "consumed"
