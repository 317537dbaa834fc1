"""Input and output shapes of the OAuth clients and connections API. Inputs are strict (unknown fields are a 400);
outputs carry metadata only: no client secret, no token, ever."""

from __future__ import annotations

from typing import Any, ClassVar

from rest_framework import serializers

from controlplane.strict import JSONBoolean, JSONString, StrictInput
from tenants.end_users import end_user_field

from ..choices import ConnectionStatus

_SCOPE = JSONString(max_length=200)
_URL = dict(required=False, allow_blank=True, max_length=2000, default="")


class OAuthClientCreateInput(StrictInput):
    provider = serializers.SlugField(max_length=60, help_text="Your name for the provider, e.g. `google`.")
    client_id = JSONString(max_length=500)
    client_secret = JSONString(required=False, allow_blank=True, max_length=2000, default="", write_only=True,
                               help_text="Write-only: stored wrapped by the vault's key, never shown again. "
                                         "Empty for a public client (PKCE only).")
    scopes = serializers.ListField(child=JSONString(max_length=200), required=False, default=list, max_length=50)
    issuer = JSONString(**_URL, help_text="An OpenID Connect issuer: the endpoints are read from its "
                                          "`/.well-known/openid-configuration` when not given.")
    authorization_endpoint = JSONString(**_URL)
    token_endpoint = JSONString(**_URL)
    userinfo_endpoint = JSONString(**_URL, help_text="Where the account id (`sub`) is read after connecting.")
    revocation_endpoint = JSONString(**_URL, help_text="RFC 7009: where a disconnect revokes the tokens "
                                                       "(discovered from the issuer when it names one).")
    refresh_reuse_grace_s = serializers.IntegerField(
        required=False, default=0, min_value=0, max_value=3600,
        help_text="The provider's documented refresh-token reuse grace, in seconds (e.g. Okta's grace period): a "
                  "refresh whose answer was lost less than this long ago is sent once more with the same refresh "
                  "token instead of ending `needs_reauth`. 0 (the default): never resent.")
    end_user_fallback = JSONBoolean(
        required=False, default=False,
        help_text="A task acting for an end user who has not connected this provider uses the customer's "
                  "tenant-wide connection (one started without `end_user`). Off by default: the task blocks.")

    # ``oauth_client_create`` needs an issuer to discover the endpoints from, or both endpoints given.
    schema_rules: ClassVar[dict[str, Any]] = {"anyOf": [
        {"properties": {"issuer": {"minLength": 1}}, "required": ["issuer"]},
        {"properties": {"authorization_endpoint": {"minLength": 1}, "token_endpoint": {"minLength": 1}},
         "required": ["authorization_endpoint", "token_endpoint"]},
    ]}


class OAuthClientOutput(serializers.Serializer):
    id = serializers.UUIDField()
    provider = serializers.CharField()
    client_id = serializers.CharField()
    has_client_secret = serializers.SerializerMethodField()
    issuer = serializers.CharField()
    authorization_endpoint = serializers.CharField()
    token_endpoint = serializers.CharField()
    userinfo_endpoint = serializers.CharField()
    revocation_endpoint = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    refresh_reuse_grace_s = serializers.IntegerField()
    end_user_fallback = serializers.BooleanField()
    created_at = serializers.DateTimeField()

    def get_has_client_secret(self, obj: object) -> bool:
        return bool(getattr(obj, "secret_kek_id", ""))


class ConnectionStartInput(StrictInput):
    provider = serializers.SlugField(max_length=60, help_text="The `provider` of one of your OAuth clients.")
    scopes = serializers.ListField(child=JSONString(max_length=200), required=False, max_length=50,
                                   help_text="Default: the client's scopes.")
    end_user = end_user_field("The end user of the customer whose account this is (your opaque id, 1-128 "
                              "characters of A-Z a-z 0-9 . _ : @ + -): only tasks acting for that end user "
                              "use it. Omitted: the customer's own, tenant-wide connection. A customer "
                              "token bound to an end user sets it.")


class ConnectionStartedOutput(serializers.Serializer):
    authorization_url = serializers.CharField(help_text="Send the customer's browser here.")
    expires_at = serializers.DateTimeField(help_text="The flow must come back before this.")


class ConnectionCompleteInput(StrictInput):
    state = JSONString(max_length=200)
    code = JSONString(max_length=2000)


class ConnectionOutput(serializers.Serializer):
    id = serializers.UUIDField()
    provider = serializers.CharField()
    end_user = serializers.CharField(allow_null=True, help_text="Whose connection this is; null: tenant-wide.")
    account_id = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField())
    status = serializers.ChoiceField(choices=ConnectionStatus.choices)
    status_reason = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)
    last_refreshed_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class ConnectionDisconnectedOutput(serializers.Serializer):
    connection = ConnectionOutput()
    provider_revocation = serializers.ChoiceField(
        choices=["revoked", "unsupported", "failed", "nothing_left"],
        help_text="`revoked`: the provider confirmed (RFC 7009); `unsupported`: your client has no revocation "
                  "endpoint; `failed`: it refused or did not answer (the tokens are deleted here anyway and stay "
                  "valid there until they expire); `nothing_left`: already disconnected.")
