"""OAuth clients of an operator, connect attempts (the ``state`` of one authorization-code flow) and connections.

No token is stored here: a connection's access and refresh tokens live in the tenant's vault
(``choices.connection_credential_name``), and a client's secret is stored wrapped by the vault's key-encryption
key, bound to the client's id (the webhooks' signing-secret pattern).
"""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models

from tenants.models import Operator, Tenant

from .choices import ConnectionStatus

__all__ = ["OAuthClient", "ConnectAttempt", "Connection"]


class OAuthClient(models.Model):
    """The operator's own registration at a provider (white-label: consent screens show the operator's app)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    operator = models.ForeignKey(Operator, on_delete=models.PROTECT, related_name="oauth_clients")
    provider = models.SlugField(max_length=60)  # the name connections and (later) ctx.connections.get use
    client_id = models.CharField(max_length=500)
    # The client secret, wrapped (vault.kek.WrappedKey fields); empty for a public client (PKCE only).
    secret_kek_id = models.CharField(max_length=300, blank=True)
    secret_blob = models.BinaryField(default=b"")
    secret_fingerprint = models.CharField(max_length=40, blank=True)
    issuer = models.URLField(max_length=2000, blank=True)  # set when the endpoints came from OIDC discovery
    authorization_endpoint = models.URLField(max_length=2000)
    token_endpoint = models.URLField(max_length=2000)
    userinfo_endpoint = models.URLField(max_length=2000, blank=True)
    # RFC 7009: where a disconnect revokes the tokens; empty when the provider has none (tokens are then only
    # deleted here, and stay valid at the provider until they expire or the customer removes the app there).
    revocation_endpoint = models.URLField(max_length=2000, blank=True)
    scopes = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    # The provider's documented refresh-token reuse grace (e.g. Okta's grace period), in seconds: a refresh whose
    # answer was lost less than this long ago is sent once more with the same refresh token. 0: never resent.
    refresh_reuse_grace_s = models.PositiveIntegerField(default=0)
    # A task acting for an end user who has not connected this provider gets the tenant-wide connection (none
    # named an end user) instead of blocking. Off by default: one person's session must not borrow the company's
    # account unless the operator says that is what its customers want.
    end_user_fallback = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["operator", "provider"], name="oauth_client_provider_unique")]

    def __str__(self) -> str:
        return f"{self.operator_id}: {self.provider}"


class ConnectAttempt(models.Model):
    """One authorization-code flow in progress. The ``state`` sent to the provider is never stored, only its
    SHA-256: a database reader cannot complete someone's flow. Single-use (``used_at``) and expiring."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="connect_attempts")
    oauth_client = models.ForeignKey(OAuthClient, on_delete=models.CASCADE, related_name="connect_attempts")
    state_sha256 = models.CharField(max_length=64, unique=True)
    # The end user of the tenant the flow was started for (tenants.end_users); None: the tenant as a whole.
    end_user = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 - None is "no end user"
    redirect_uri = models.URLField(max_length=2000)
    scopes = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"attempt {self.pk} ({self.tenant_id})"


class Connection(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="connections")
    oauth_client = models.ForeignKey(OAuthClient, on_delete=models.PROTECT, related_name="connections")
    provider = models.SlugField(max_length=60)
    # Whose account this is among the tenant's end users (tenants.end_users); None: the tenant's own, shared.
    end_user = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001 - None is "no end user"
    account_id = models.CharField(max_length=300, blank=True)  # the provider's subject, when it says one
    scopes = ArrayField(models.CharField(max_length=200), default=list, blank=True)  # as granted
    status = models.CharField(max_length=20, choices=ConnectionStatus.choices, default=ConnectionStatus.ACTIVE)
    status_reason = models.CharField(max_length=40, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)  # the access token's
    last_refreshed_at = models.DateTimeField(null=True, blank=True)
    # Set (and committed) before a refresh request leaves, cleared with the new tokens' commit. Found set by the
    # next refresher, it means one died in between: the provider may have rotated the refresh token we hold.
    refresh_sent_at = models.DateTimeField(null=True, blank=True)
    # Set (and committed) when the refresh marked by ``refresh_sent_at`` is sent a second time under the client's
    # ``refresh_reuse_grace_s``: at most one resend per refresh token, cleared with the new tokens' commit.
    refresh_resent_at = models.DateTimeField(null=True, blank=True)
    # Delivery audit coalescing (OAUTH_DELIVERY_AUDIT_INTERVAL_S): when the last connection.deliver row was written,
    # and how many deliveries since went without a row of their own (the next row carries the count).
    delivery_audited_at = models.DateTimeField(null=True, blank=True)
    deliveries_unaudited = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "provider"]), models.Index(fields=["status", "expires_at"])]
        # One connection in use per (tenant, provider, end user); None is one value here (the tenant-wide one).
        constraints = [models.UniqueConstraint(fields=["tenant", "provider", "end_user"], nulls_distinct=False,
                                               condition=models.Q(status="active"), name="connection_active_unique")]

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.provider} {self.account_id}"
