"""The OAuth 2.0 client side, as RFC 6749 (authorization code, refresh), RFC 7636 (PKCE S256) and OpenID Connect
Discovery define it. No database here, and nothing here logs: tokens pass through as values only.

Server-side request forgery: every URL we send a request to (discovery, token, userinfo, revocation) must resolve,
at registration and again at each request, to public addresses only (``address_check``): loopback, private,
link-local (cloud metadata at 169.254.169.254), shared, multicast and reserved ranges are refused unless
``OAUTH_ALLOW_PRIVATE_ADDRESSES`` (development and tests) allows them.

Errors never carry a token or a secret: a provider's error answer is reduced to its ``error`` code (and a short,
provider-written ``error_description``), never echoed whole.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import secrets
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import certifi
import httpx
from django.conf import settings

from controlplane.addresses import is_public_address
from controlplane.errors import ApplicationError, ValidationFailed

__all__ = [
    "ProviderEndpoints", "TokenSet", "OAuthProviderError", "OAuthTransportError",
    "url_check", "address_check", "discover", "pkce_pair", "new_state", "authorization_url", "exchange_code", "refresh",
    "userinfo_subject", "revoke",
]

_MAX_BODY = 256 * 1024


class OAuthProviderError(ApplicationError):
    """The provider answered with an OAuth error (``error`` is its code, e.g. ``invalid_grant``)."""

    status_code = 502
    title = "OAuth provider refused"
    type_slug = "oauth-provider-refused"

    def __init__(self, error: str) -> None:
        # Only the code: an error_description is the provider's free text and could quote what it refused.
        self.error = "".join(c for c in error[:60] if c.isascii() and (c.isalnum() or c in "_-.")) or "unknown"
        super().__init__(f"the provider answered {self.error}", extra={"oauth_error": self.error})


class OAuthTransportError(ApplicationError):
    """No usable answer (connection refused, timeout, not JSON). ``sent`` says whether the request may have reached
    the provider, which matters for a refresh: a sent refresh may have rotated the token."""

    status_code = 502
    title = "OAuth provider unreachable"
    type_slug = "oauth-provider-unreachable"

    def __init__(self, detail: str, *, sent: bool) -> None:
        self.sent = sent
        super().__init__(detail)


@dataclass(frozen=True)
class ProviderEndpoints:
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str = ""
    issuer: str = ""
    revocation_endpoint: str = ""


@dataclass(frozen=True)
class TokenSet:
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    expires_in: int | None
    scope: str | None
    token_type: str = "Bearer"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def address_check(url: str, *, name: str) -> None:
    """Every address ``url``'s host resolves to must be public (``ipaddress``'s ``is_global``, not multicast), unless
    ``OAUTH_ALLOW_PRIVATE_ADDRESSES``. Checked after DNS resolution, so a public name pointing at 10.0.0.5 or at the
    metadata service is refused like the literal address. ValidationFailed names the URL's field, not the address."""
    if settings.OAUTH_ALLOW_PRIVATE_ADDRESSES:
        return
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (ValueError, UnicodeError, OSError):
        raise ValidationFailed(f"{name}: its host does not resolve") from None
    addresses = {str(info[4][0]) for info in infos}
    if not addresses or not all(is_public_address(address) for address in addresses):
        raise ValidationFailed(f"{name}: its host resolves to a loopback, private, link-local or reserved address; "
                               "OAuth endpoints must be public")


def _address_at_send(url: str, *, name: str) -> None:
    """``address_check`` again at the moment of a request (the name may resolve elsewhere since registration);
    a refusal here means nothing was sent."""
    try:
        address_check(url, name=name)
    except ValidationFailed as refused:
        raise OAuthTransportError(refused.detail, sent=False) from None


def url_check(url: str, *, name: str) -> str:
    """https only; plain http only to a loopback host and only where ``OAUTH_ALLOW_HTTP_LOOPBACK`` (development and
    tests) allows it. Tokens and client secrets travel to these URLs, so no credentials or fragments in them. The
    host must resolve to public addresses (``address_check``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ValidationFailed(f"{name} is not a URL") from None
    host = parts.hostname or ""
    if not host or parts.username or parts.password or parts.fragment:
        raise ValidationFailed(f"{name} must be an absolute URL with a host, no credentials and no fragment")
    if not (parts.scheme == "https"
            or (parts.scheme == "http" and _loopback(host) and settings.OAUTH_ALLOW_HTTP_LOOPBACK)):
        raise ValidationFailed(f"{name} must use https")
    address_check(url, name=name)
    return url


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context per process: building one loads the whole CA bundle, tens of milliseconds a
    client (most of a refresh's own time before it was shared; bench/bench_connections.py)."""
    return ssl.create_default_context(cafile=certifi.where())


def _client() -> httpx.Client:
    # No redirects: a token endpoint that redirects would have us re-send a code or refresh token elsewhere.
    return httpx.Client(timeout=settings.OAUTH_HTTP_TIMEOUT_S, follow_redirects=False, verify=_tls(),
                        headers={"Accept": "application/json", "User-Agent": "agent-control-plane-oauth/1"})


def _json(response: httpx.Response) -> dict[str, Any]:
    if len(response.content) > _MAX_BODY:
        raise OAuthTransportError("the provider's answer is too large", sent=True)
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise OAuthTransportError(f"the provider answered HTTP {response.status_code} without a JSON object",
                                  sent=True)
    return body


def discover(issuer: str) -> ProviderEndpoints:
    """OpenID Connect Discovery 1.0: ``<issuer>/.well-known/openid-configuration``; the document's ``issuer`` must
    be the one asked for (section 4.3), and every endpoint passes ``url_check``."""
    url_check(issuer, name="issuer")
    try:
        with _client() as client:
            response = client.get(issuer.rstrip("/") + "/.well-known/openid-configuration")
    except httpx.HTTPError as exc:
        raise ValidationFailed(f"OIDC discovery failed: {type(exc).__name__}") from None
    if response.status_code != 200:
        raise ValidationFailed(f"OIDC discovery answered HTTP {response.status_code}")
    try:
        doc = _json(response)
    except OAuthTransportError:
        raise ValidationFailed("OIDC discovery did not answer a JSON object") from None
    if str(doc.get("issuer", "")).rstrip("/") != issuer.rstrip("/"):
        raise ValidationFailed("the discovery document names another issuer")
    try:
        return ProviderEndpoints(
            authorization_endpoint=url_check(str(doc["authorization_endpoint"]), name="authorization_endpoint"),
            token_endpoint=url_check(str(doc["token_endpoint"]), name="token_endpoint"),
            userinfo_endpoint=(url_check(str(doc["userinfo_endpoint"]), name="userinfo_endpoint")
                               if doc.get("userinfo_endpoint") else ""),
            issuer=str(doc["issuer"]),
            # RFC 8414 metadata, also in OIDC discovery documents (Google's, for one): optional.
            revocation_endpoint=(url_check(str(doc["revocation_endpoint"]), name="revocation_endpoint")
                                 if doc.get("revocation_endpoint") else ""),
        )
    except KeyError as missing:
        raise ValidationFailed(f"the discovery document has no {missing.args[0]}") from None


def pkce_pair(seed: str) -> tuple[str, str]:
    """RFC 7636 S256: the verifier and its challenge. The verifier is derived from the flow's ``state`` with the
    server's key (HMAC), so it is never stored: only whoever holds both the state and the key can present it."""
    mac = hashlib.blake2b(seed.encode(), key=settings.SECRET_KEY.encode()[:64], digest_size=48, person=b"oauth-pkce")
    verifier = base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()  # 64 chars of [A-Za-z0-9_-]
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def new_state() -> str:
    return secrets.token_urlsafe(32)


def authorization_url(*, endpoint: str, client_id: str, redirect_uri: str, scopes: list[str], state: str,
                      code_challenge: str) -> str:
    params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect_uri, "state": state,
              "code_challenge": code_challenge, "code_challenge_method": "S256"}
    if scopes:
        params["scope"] = " ".join(scopes)
    return endpoint + ("&" if urlsplit(endpoint).query else "?") + urlencode(params)


def _token_request(endpoint: str, form: dict[str, str], *, client_id: str, client_secret: str) -> TokenSet:
    # client_secret_basic (RFC 6749 2.3.1); a public client names itself in the body instead.
    auth = httpx.BasicAuth(client_id, client_secret) if client_secret else None
    if not client_secret:
        form = {**form, "client_id": client_id}
    _address_at_send(endpoint, name="token_endpoint")
    try:
        with _client() as client:
            response = client.post(endpoint, data=form, auth=auth) if auth else client.post(endpoint, data=form)
    except httpx.ConnectError:
        raise OAuthTransportError("the token endpoint could not be reached", sent=False) from None
    except httpx.HTTPError as exc:
        raise OAuthTransportError(f"the token request failed: {type(exc).__name__}", sent=True) from None
    body = _json(response)
    if response.status_code != 200 or "error" in body:
        raise OAuthProviderError(str(body.get("error") or f"http_{response.status_code}"))
    access = body.get("access_token")
    if not isinstance(access, str) or not access:
        raise OAuthTransportError("the token answer has no access_token", sent=True)
    refresh_token, scope = body.get("refresh_token"), body.get("scope")
    return TokenSet(access_token=access, refresh_token=refresh_token if isinstance(refresh_token, str) else None,
                    expires_in=_seconds(body.get("expires_in")), scope=scope if isinstance(scope, str) else None,
                    token_type=str(body.get("token_type") or "Bearer"))


def _seconds(value: object) -> int | None:
    """``expires_in`` as RFC 6749 has it (a number), or as a string of digits, which some providers send."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return max(0, int(value))
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def exchange_code(*, endpoint: str, client_id: str, client_secret: str, code: str, redirect_uri: str,
                  code_verifier: str) -> TokenSet:
    return _token_request(endpoint, {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
                                     "code_verifier": code_verifier}, client_id=client_id, client_secret=client_secret)


def refresh(*, endpoint: str, client_id: str, client_secret: str, refresh_token: str) -> TokenSet:
    return _token_request(endpoint, {"grant_type": "refresh_token", "refresh_token": refresh_token},
                          client_id=client_id, client_secret=client_secret)


def userinfo_subject(*, endpoint: str, access_token: str) -> str:
    """The account id (OIDC ``sub``) from the userinfo endpoint; empty when it gives none. Best effort: a failing
    userinfo call does not undo a connection that the token exchange made."""
    try:
        _address_at_send(endpoint, name="userinfo_endpoint")
        with _client() as client:
            response = client.get(endpoint, headers={"Authorization": f"Bearer {access_token}"})
        body = _json(response) if response.status_code == 200 else {}
    except (httpx.HTTPError, OAuthTransportError):
        return ""
    sub = body.get("sub")
    return str(sub)[:300] if isinstance(sub, (str, int)) else ""


def revoke(*, endpoint: str, client_id: str, client_secret: str, token: str, token_type_hint: str) -> None:
    """RFC 7009 token revocation. The server answers 200 for a token it revoked and for one it did not know
    (section 2.2), so only an error answer or no answer is a failure (OAuthProviderError, OAuthTransportError)."""
    form = {"token": token, "token_type_hint": token_type_hint}
    auth = httpx.BasicAuth(client_id, client_secret) if client_secret else None
    if not client_secret:
        form["client_id"] = client_id
    _address_at_send(endpoint, name="revocation_endpoint")
    try:
        with _client() as client:
            response = client.post(endpoint, data=form, auth=auth) if auth else client.post(endpoint, data=form)
    except httpx.ConnectError:
        raise OAuthTransportError("the revocation endpoint could not be reached", sent=False) from None
    except httpx.HTTPError as exc:
        raise OAuthTransportError(f"the revocation request failed: {type(exc).__name__}", sent=True) from None
    if response.status_code != 200:
        try:
            error = str(_json(response).get("error") or f"http_{response.status_code}")
        except OAuthTransportError:
            error = f"http_{response.status_code}"
        raise OAuthProviderError(error)
