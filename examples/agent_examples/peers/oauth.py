"""The example OAuth 2.0 authorization server: the provider of ``make demo``'s connected account (run as a process:
``python -m agent_examples.peers.oauth``) and of the connections tests (in a thread: ``with OAuthPeer() as peer``).
Built with Authlib's Flask integration, served over HTTP on 127.0.0.1: authorization code with PKCE (S256 required),
refresh tokens with rotation and reuse detection (a rotated-out refresh token presented again revokes its whole
family, as Google, Auth0 and Okta do), short access-token lifetimes, a userinfo endpoint, RFC 7009 revocation (a
revoked refresh token ends its whole grant: the family's refresh and access tokens) and OpenID Connect discovery.

The consent step is automatic: ``/authorize`` grants the request for ``peer.user`` (the person at the browser);
with ``consent_page=True`` it is a real page (client, scopes, an Allow and a Deny button) a browser submits.
``/resource`` is a protected resource: it checks the bearer access token on every call (unknown, revoked or
expired: 401) and counts every call, accepted or refused, for the tests to assert on.
What the tests assert on is recorded here, at the peer: every refresh token presented and every reuse.

``reuse_grace_s`` (0: none) is a refresh-token reuse grace like Okta's: a rotated-out refresh token presented again
within that many seconds of its rotation is accepted once and answered with the same new tokens its rotation
issued (recorded in ``grace_reuses``); a second reuse, or one after the grace, is reuse as above.
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from flask import Flask, jsonify, request
from markupsafe import escape
from werkzeug.serving import WSGIRequestHandler, make_server

__all__ = ["OAuthPeer"]


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args: Any, **kwargs: Any) -> None:  # request lines carry codes and states
        pass


@dataclass
class _Client(ClientMixin):  # type: ignore[misc]
    client_id: str
    client_secret: str
    scope: str

    def get_client_id(self) -> str:
        return self.client_id

    def get_default_redirect_uri(self) -> str | None:
        return None

    def get_allowed_scope(self, scope: str) -> str:
        allowed = set(self.scope.split())
        return " ".join(s for s in (scope or "").split() if s in allowed)

    def check_redirect_uri(self, redirect_uri: str) -> bool:
        return bool(redirect_uri)  # any: the control plane's callback URL differs per test server

    def check_client_secret(self, client_secret: str) -> bool:
        return secrets.compare_digest(client_secret, self.client_secret)

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method == "client_secret_basic" if endpoint == "token" else True

    def check_response_type(self, response_type: str) -> bool:
        return response_type == "code"

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type in ("authorization_code", "refresh_token")


@dataclass
class _Code:
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    user: str
    code_challenge: str
    code_challenge_method: str
    auth_time: float = field(default_factory=time.time)

    def get_redirect_uri(self) -> str:
        return self.redirect_uri

    def get_scope(self) -> str:
        return self.scope

    def get_nonce(self) -> None:
        return None

    def get_auth_time(self) -> float:
        return self.auth_time

    def get_code_challenge(self) -> str:
        return self.code_challenge

    def get_code_challenge_method(self) -> str:
        return self.code_challenge_method


@dataclass
class _RefreshToken:
    token: str
    client_id: str
    scope: str
    user: str
    family: str
    revoked: bool = False

    def check_client(self, client: _Client) -> bool:
        return client.client_id == self.client_id

    def get_scope(self) -> str:
        return self.scope

    def get_expires_in(self) -> int:
        return 86400

    def is_revoked(self) -> bool:
        return self.revoked

    def is_expired(self) -> bool:
        return False


@dataclass
class _PresentedAccessToken:
    token: str
    client_id: str

    def check_client(self, client: _Client) -> bool:
        return client.client_id == self.client_id


class OAuthPeer:
    """Start with ``with OAuthPeer() as peer``; ``peer.issuer`` is its base URL."""

    def __init__(self, *, access_token_lifetime_s: int = 60, scope: str = "openid email calendar",
                 consent_page: bool = False, port: int = 0, client_id: str = "", client_secret: str = "",
                 reuse_grace_s: float = 0.0) -> None:
        self.client = _Client(client_id=client_id or "cp-" + secrets.token_hex(4),
                              client_secret=client_secret or secrets.token_urlsafe(24), scope=scope)
        self.user = "alice@example.com"
        self.lock = threading.Lock()
        self.codes: dict[str, _Code] = {}
        self.access_tokens: dict[str, str] = {}  # token -> user (a revoked one is removed)
        self.access_expiry: dict[str, float] = {}  # token -> monotonic deadline
        self.resource_calls: list[tuple[bool, str]] = []  # (accepted, why) of every /resource call
        self.consent_page = consent_page
        self.consents: list[str] = []  # "allow" / "deny" of every consent form submitted
        self.access_families: dict[str, str] = {}  # access token -> the refresh-token family it was issued with
        self.revocations: list[tuple[str, str]] = []  # (token_type_hint, token) of every RFC 7009 revocation
        self.refresh_tokens: dict[str, _RefreshToken] = {}
        self.refresh_presented: list[str] = []  # every refresh token sent to the token endpoint, in order
        self.reuse_detected: list[str] = []
        self.revoked_families: set[str] = set()
        self.issued: list[dict[str, Any]] = []  # every token answer, to scan our logs and answers for
        self.token_delay_s = 0.0  # holds the token endpoint's answer after granting: overlaps, lost answers
        self.token_delays: list[float] = []  # per answer, in order, before token_delay_s applies again
        self.reuse_grace_s = reuse_grace_s
        # rotated-out refresh token -> (monotonic time of its rotation, the answer that rotated it)
        self.rotations: dict[str, tuple[float, dict[str, Any]]] = {}
        self.grace_reuses: list[str] = []  # refresh tokens accepted again within the grace (once each)
        self.app = self._build_app(access_token_lifetime_s)
        self._server = make_server("127.0.0.1", port, self.app, threaded=True, request_handler=_QuietHandler)
        self.issuer = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="oauth-peer", daemon=True)

    def __enter__(self) -> OAuthPeer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)

    def revoke_all(self) -> None:
        """The user removed the app's access at the provider: every refresh token stops working."""
        with self.lock:
            for token in self.refresh_tokens.values():
                token.revoked = True
                self.revoked_families.add(token.family)

    def _build_app(self, lifetime_s: int) -> Flask:
        peer = self
        app = Flask("oauth_peer")
        app.config.update(OAUTH2_REFRESH_TOKEN_GENERATOR=True,
                          OAUTH2_TOKEN_EXPIRES_IN={"authorization_code": lifetime_s, "refresh_token": lifetime_s})

        def query_client(client_id: str) -> _Client | None:
            return peer.client if client_id == peer.client.client_id else None

        def save_token(token: dict[str, Any], req: Any) -> None:
            with peer.lock:
                peer.issued.append(dict(token))
                user = req.user
                peer.access_tokens[token["access_token"]] = user
                peer.access_expiry[token["access_token"]] = time.monotonic() + float(token.get("expires_in", 0))
                old = req.form.get("refresh_token")
                family = peer.refresh_tokens[old].family if old in peer.refresh_tokens else secrets.token_hex(8)
                peer.access_families[token["access_token"]] = family
                if old in peer.refresh_tokens and token.get("refresh_token"):
                    peer.rotations[old] = (time.monotonic(), dict(token))
                if token.get("refresh_token"):
                    peer.refresh_tokens[token["refresh_token"]] = _RefreshToken(
                        token=token["refresh_token"], client_id=req.client.client_id, scope=token.get("scope", ""),
                        user=user, family=family)

        class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):  # type: ignore[misc]
            TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic"]

            def save_authorization_code(self, code: str, req: Any) -> None:
                data = req.payload.data
                with peer.lock:
                    peer.codes[code] = _Code(code=code, client_id=req.client.client_id,
                                             redirect_uri=req.payload.redirect_uri, scope=req.scope or "",
                                             user=req.user, code_challenge=data.get("code_challenge", ""),
                                             code_challenge_method=data.get("code_challenge_method", ""))

            def query_authorization_code(self, code: str, client: _Client) -> _Code | None:
                found = peer.codes.get(code)
                return found if found is not None and found.client_id == client.client_id else None

            def delete_authorization_code(self, authorization_code: _Code) -> None:
                with peer.lock:
                    peer.codes.pop(authorization_code.code, None)

            def authenticate_user(self, authorization_code: _Code) -> str:
                return authorization_code.user

        class RefreshTokenGrant(grants.RefreshTokenGrant):  # type: ignore[misc]
            INCLUDE_NEW_REFRESH_TOKEN = True  # rotation

            def authenticate_refresh_token(self, refresh_token: str) -> _RefreshToken | None:
                with peer.lock:
                    peer.refresh_presented.append(refresh_token)
                    found = peer.refresh_tokens.get(refresh_token)
                    if found is None:
                        return None
                    if found.revoked or found.family in peer.revoked_families:
                        if found.family not in peer.revoked_families:
                            peer.reuse_detected.append(refresh_token)
                        peer.revoked_families.add(found.family)  # reuse: the whole family goes
                        return None
                    return found

            def authenticate_user(self, credential: _RefreshToken) -> str:
                return credential.user

            def revoke_old_credential(self, refresh_token: _RefreshToken) -> None:
                with peer.lock:
                    refresh_token.revoked = True

        class Revocation(RevocationEndpoint):  # type: ignore[misc]
            CLIENT_AUTH_METHODS = ["client_secret_basic"]

            def query_token(self, token_string: str, token_type_hint: str | None) -> Any:
                with peer.lock:
                    if token_type_hint != "access_token" and token_string in peer.refresh_tokens:
                        return peer.refresh_tokens[token_string]
                    if token_string in peer.access_tokens:
                        return _PresentedAccessToken(token_string, peer.client.client_id)
                return None  # unknown: still 200 (RFC 7009 2.2)

            def revoke_token(self, token: Any, request: Any) -> None:
                with peer.lock:
                    if isinstance(token, _RefreshToken):
                        peer.revocations.append(("refresh_token", token.token))
                        peer.revoked_families.add(token.family)  # the whole grant ends
                        for each in peer.refresh_tokens.values():
                            each.revoked = each.revoked or each.family == token.family
                        for access in [a for a, f in peer.access_families.items() if f == token.family]:
                            peer.access_tokens.pop(access, None)
                    else:
                        peer.revocations.append(("access_token", token.token))
                        peer.access_tokens.pop(token.token, None)

        server = AuthorizationServer(app, query_client=query_client, save_token=save_token)
        server.register_grant(AuthorizationCodeGrant, [CodeChallenge(required=True)])
        server.register_grant(RefreshTokenGrant)
        server.register_endpoint(Revocation)

        @app.post("/revoke")
        def revoke() -> Any:
            return server.create_endpoint_response("revocation")

        @app.route("/authorize", methods=["GET", "POST"])
        def authorize() -> Any:
            if request.values.get("code_challenge_method") != "S256" or not request.values.get("code_challenge"):
                return jsonify(error="invalid_request", error_description="PKCE S256 is required here"), 400
            if not peer.consent_page:
                return server.create_authorization_response(grant_user=peer.user)
            if request.method == "GET":
                hidden = "".join(f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
                                 for k, v in request.args.items())
                return (f"<!doctype html><html><head><title>Example OAuth server</title></head><body>"
                        f"<h1>Authorize {escape(peer.client.client_id)}</h1>"
                        f"<p>Signed in as {escape(peer.user)}. It asks for: "
                        f"<span id='scopes'>{escape(request.args.get('scope', ''))}</span></p>"
                        f"<form method='post' action='/authorize'>{hidden}"
                        f"<button name='decision' value='allow'>Allow</button>"
                        f"<button name='decision' value='deny'>Deny</button></form></body></html>")
            decision = request.form.get("decision", "deny")
            peer.consents.append(decision)
            return server.create_authorization_response(grant_user=peer.user if decision == "allow" else None)

        @app.get("/resource")
        def resource() -> Any:
            """A protected API of the provider's: the token is checked on every call."""
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            with peer.lock:
                user = peer.access_tokens.get(token) if scheme.lower() == "bearer" else None
                expired = user is not None and time.monotonic() > peer.access_expiry.get(token, 0.0)
                why = "ok" if user is not None and not expired else ("expired" if expired else "unknown")
                peer.resource_calls.append((why == "ok", why))
            if why != "ok":
                return jsonify(error="invalid_token", error_description=why), 401
            return jsonify(user=user, events=[{"title": "Quarterly review"}])

        def within_grace() -> dict[str, Any] | None:
            """The answer of the rotation a refresh token presented again is within the reuse grace of, once."""
            if not peer.reuse_grace_s or request.form.get("grant_type") != "refresh_token":
                return None
            scheme, _, basic = request.headers.get("Authorization", "").partition(" ")
            try:
                client_id, _, secret = base64.b64decode(basic).decode().partition(":")
            except ValueError:
                return None
            if scheme.lower() != "basic" or (client_id, secret) != (peer.client.client_id, peer.client.client_secret):
                return None
            presented = request.form.get("refresh_token", "")
            with peer.lock:
                rotated = peer.rotations.get(presented)
                if (rotated is None or presented in peer.grace_reuses
                        or time.monotonic() - rotated[0] >= peer.reuse_grace_s
                        or peer.refresh_tokens[presented].family in peer.revoked_families):
                    return None
                peer.refresh_presented.append(presented)
                peer.grace_reuses.append(presented)
                return rotated[1]

        @app.post("/token")
        def issue_token() -> Any:
            again = within_grace()
            # The grant (and any rotation) is done here, or the grace repeats a rotation's answer...
            answer = jsonify(again) if again is not None else server.create_token_response()
            delay = peer.token_delays.pop(0) if peer.token_delays else peer.token_delay_s
            if delay:
                time.sleep(delay)  # ...and the answer is slow to leave
            return answer

        @app.get("/userinfo")
        def userinfo() -> Any:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            user = peer.access_tokens.get(token) if scheme.lower() == "bearer" else None
            if user is None:
                return jsonify(error="invalid_token"), 401
            return jsonify(sub=f"user-{user.split('@')[0]}", email=user)

        @app.get("/.well-known/openid-configuration")
        def discovery() -> Any:
            return jsonify(issuer=peer.issuer, authorization_endpoint=f"{peer.issuer}/authorize",
                           token_endpoint=f"{peer.issuer}/token", userinfo_endpoint=f"{peer.issuer}/userinfo",
                           revocation_endpoint=f"{peer.issuer}/revoke",
                           response_types_supported=["code"], code_challenge_methods_supported=["S256"],
                           grant_types_supported=["authorization_code", "refresh_token"])

        return app


def _secret(path: str) -> str:
    if not path:
        return ""
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


def main() -> None:
    """The demo's provider: ``AGENT_OAUTH_PORT`` (0: ephemeral), the one registered client ``AGENT_OAUTH_CLIENT_ID``
    with the secret in the file ``AGENT_OAUTH_CLIENT_SECRET_FILE``, access tokens of ``AGENT_OAUTH_TOKEN_LIFETIME_S``
    (300), a consent page.
    ``/stats`` (no token in it) counts resource calls, refreshes and any refresh-token reuse."""
    peer = OAuthPeer(access_token_lifetime_s=int(os.environ.get("AGENT_OAUTH_TOKEN_LIFETIME_S", "300")),
                     consent_page=True, port=int(os.environ.get("AGENT_OAUTH_PORT", "0")),
                     client_id=os.environ.get("AGENT_OAUTH_CLIENT_ID", "demo-control-plane"),
                     client_secret=_secret(os.environ.get("AGENT_OAUTH_CLIENT_SECRET_FILE", "")))
    peer.user = os.environ.get("AGENT_OAUTH_USER", "alice@example.com")

    @peer.app.get("/stats")
    def stats() -> Any:
        with peer.lock:
            return jsonify(resource_calls=len(peer.resource_calls),
                           resource_refused=sum(1 for ok, _ in peer.resource_calls if not ok),
                           refreshes=len(peer.refresh_presented), reuse_detected=len(peer.reuse_detected),
                           revoked_families=len(peer.revoked_families))

    from agent_examples.peers._serve import announce_port

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    announce_port(peer._server.server_port, "example OAuth server")
    try:
        peer._server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass


if __name__ == "__main__":
    main()
