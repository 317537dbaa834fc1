"""Statuses of a connected account and the reasons it stops working. No I/O here."""

from __future__ import annotations

from django.db import models

__all__ = ["DISCONNECTED", "SUPERSEDED", "ConnectionStatus", "ReauthReason", "connection_credential_name"]


class ConnectionStatus(models.TextChoices):
    ACTIVE = "active"
    # The provider refused the refresh token (invalid_grant), or a refresh was interrupted after the provider may
    # have rotated it: only the customer connecting again mends it. Never retried blind.
    NEEDS_REAUTH = "needs_reauth"
    REVOKED = "revoked"


class ReauthReason(models.TextChoices):
    INVALID_GRANT = "invalid_grant", "The provider refused the refresh token (revoked, expired or reused)"
    REFRESH_INTERRUPTED = "refresh_interrupted", (
        "A refresh was sent and its answer never committed: the provider may have rotated the refresh token, so "
        "replaying the old one could trip its reuse detection"
    )
    NO_REFRESH_TOKEN = "no_refresh_token", "The access token expired and the provider gave no refresh token"


# ``status_reason`` of a connection the operator (or the customer through it) disconnected: status ``revoked``.
DISCONNECTED = "disconnected"
# ``status_reason`` of an active connection replaced by a newer one of the same tenant, provider and end user (the
# customer connected again): status ``revoked``, its tokens deleted here (not revoked at the provider, where the
# new connection may share its grant).
SUPERSEDED = "superseded"


def connection_credential_name(connection_id: object) -> str:
    """The vault credential holding a connection's tokens: under ``system.``, so the operator's credential API
    neither lists nor writes it and an instance's credential delivery refuses it (tokens reach an instance only
    through the connections delivery, ``GET /internal/v1/connections/<provider>``)."""
    return f"system.connection.{connection_id}"
