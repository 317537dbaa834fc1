"""S3 session credentials that renew themselves before they expire, from the control plane. Django-free.

An instance boots with STS credentials in its environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_CREDENTIAL_EXPIRATION, from its Secret). They live at most an hour, and a pod
keeps its environment until it restarts, so the S3 client is given botocore's
``RefreshableCredentials``: the boot values first, and before ``AWS_CREDENTIAL_EXPIRATION`` a refresh
that asks the control plane (``GET {AGENT_CONTROL_PLANE_URL}/internal/v1/s3-credentials/<tenant-id>``
with the instance token, the same authentication as credential delivery) for fresh ones, vended
for this tenant's prefix only. The answer must name this instance's own prefix or it is refused.

Thresholds (botocore's two windows): from ``AGENT_S3_CREDENTIALS_REFRESH_BEFORE_S`` (default 900 s)
before expiry a refresh is tried on use and a failure is only logged (the current credentials still
work); from ``min(600, that)`` before expiry the refresh must succeed or the S3 call fails with
CredentialUnavailable. Values never appear in repr, logs or exception messages.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from agent_runtime.errors import ConfigError, CredentialUnavailable
from agent_runtime.internal_api import InternalApiUnavailable, internal_get_json

__all__ = ["ControlPlaneS3Credentials", "DEFAULT_REFRESH_BEFORE_S", "instance_s3_client", "refreshable_credentials"]

log = logging.getLogger(__name__)

DEFAULT_REFRESH_BEFORE_S = 900
MANDATORY_REFRESH_MAX_S = 600
METHOD = "agent-control-plane"
_BOOT_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_CREDENTIAL_EXPIRATION")


class ControlPlaneS3Credentials:
    """The refresh callback: fresh credentials for ``prefix`` of ``tenant_id``, in botocore's metadata shape."""

    def __init__(self, base_url: str, token: str, tenant_id: str, prefix: str, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.tenant_id = tenant_id
        self.prefix = prefix
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"ControlPlaneS3Credentials({self.base_url!r}, tenant={self.tenant_id!r})"

    def __call__(self) -> dict[str, str]:
        try:
            body = internal_get_json(self.base_url, self._token,
                                     f"/internal/v1/s3-credentials/{quote(self.tenant_id, safe='')}",
                                     timeout_s=self.timeout_s)
        except InternalApiUnavailable as exc:
            raise CredentialUnavailable(f"S3 credentials not renewed: {exc.why}") from None
        try:
            if body["prefix"] != self.prefix:
                raise CredentialUnavailable("S3 credentials refused: the control plane answered for another prefix")
            metadata = {"access_key": str(body["access_key_id"]), "secret_key": str(body["secret_access_key"]),
                        "token": str(body["session_token"]), "expiry_time": _iso(str(body["expiration"]))}
        except (KeyError, TypeError, ValueError):
            raise CredentialUnavailable("S3 credentials not renewed: malformed answer from control plane") from None
        log.info("S3 session credentials renewed", extra={"event": "s3_credentials_renewed",
                                                          "expires_at": metadata["expiry_time"]})
        return metadata


def _iso(value: str) -> str:
    """An expiry botocore parses; a naive time is UTC (as STS means it)."""
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat()


def refreshable_credentials(env: Mapping[str, str], *, tenant_id: str, prefix: str) -> Any:
    """RefreshableCredentials starting from the boot variables; None where there is nothing to renew.

    None (boto3's default chain applies) when the environment has no AWS_CREDENTIAL_EXPIRATION (the
    credentials are not session ones) or no control plane to ask (a local or test setup).
    """
    from botocore.credentials import RefreshableCredentials

    url, token = env.get("AGENT_CONTROL_PLANE_URL"), env.get("AGENT_INSTANCE_TOKEN")
    if not (env.get("AWS_CREDENTIAL_EXPIRATION") and url and token):
        return None
    missing = [name for name in _BOOT_VARS if not env.get(name)]
    if missing:
        raise ConfigError(f"S3 session credentials incomplete in the environment: {', '.join(missing)} unset")
    try:
        refresh_before = int(env.get("AGENT_S3_CREDENTIALS_REFRESH_BEFORE_S") or DEFAULT_REFRESH_BEFORE_S)
        expiry = _iso(env["AWS_CREDENTIAL_EXPIRATION"])
    except ValueError as exc:
        raise ConfigError(f"S3 credential settings unreadable: {type(exc).__name__}") from None
    if refresh_before <= 0:
        raise ConfigError("AGENT_S3_CREDENTIALS_REFRESH_BEFORE_S must be positive")
    boot = {"access_key": env["AWS_ACCESS_KEY_ID"], "secret_key": env["AWS_SECRET_ACCESS_KEY"],
            "token": env["AWS_SESSION_TOKEN"], "expiry_time": expiry}
    return RefreshableCredentials.create_from_metadata(
        metadata=boot, refresh_using=ControlPlaneS3Credentials(url, token, tenant_id, prefix), method=METHOD,
        advisory_timeout=refresh_before, mandatory_timeout=min(MANDATORY_REFRESH_MAX_S, refresh_before),
    )


def instance_s3_client(env: Mapping[str, str], *, tenant_id: str, prefix: str) -> Any:
    """The instance's S3 client: renewing credentials when the environment has session ones, else boto3's chain.

    Region and endpoint come from ``env`` (AWS_REGION, AWS_ENDPOINT_URL_S3), as boto3 would read them.
    """
    import boto3
    import botocore.session
    from botocore.config import Config

    session = botocore.session.Session()
    credentials = refreshable_credentials(env, tenant_id=tenant_id, prefix=prefix)
    kwargs: dict[str, Any] = {
        "region_name": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        "endpoint_url": env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
        "config": Config(retries={"max_attempts": 5, "mode": "standard"}, s3={"addressing_style": "path"}),
    }
    if credentials is not None:
        # The public way to give a session credentials of our own: a provider ahead of the default chain.
        session.get_component("credential_provider").insert_before("env", _FixedProvider(credentials))
    return boto3.session.Session(botocore_session=session).client("s3", **kwargs)


class _FixedProvider:
    """A botocore credential provider that hands out one RefreshableCredentials (which renews itself)."""

    METHOD = METHOD
    CANONICAL_NAME = "AgentControlPlane"

    def __init__(self, credentials: Any) -> None:
        self._credentials = credentials

    def load(self) -> Any:
        return self._credentials
