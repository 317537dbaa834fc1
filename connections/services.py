"""Connected accounts: operators' OAuth clients, the connect flow, and refreshing a connection's tokens.

Tokens are written to and read from the tenant's vault (``vault.services``) under a ``system.`` name per
connection, so every version is sealed with the tenant's data key and bound by its associated data to the tenant,
the connection and the version. Nothing here logs a token, and no error carries one.

Refresh is single-flight: a PostgreSQL session advisory lock per connection is held from the decision to the
commit of the new tokens (a second refresher gets ``in_flight`` and never sends the refresh token we hold), and
every state change happens under the connection's row lock. A refresh is an effect: ``refresh_sent_at`` is
committed before the request leaves, so a refresher that dies between the provider's answer and our commit is
found out by the next one, which marks the connection ``needs_reauth`` instead of replaying a refresh token the
provider may already have rotated (reuse detection would revoke the whole token family).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.module_loading import import_string

from controlplane.errors import ApplicationError, Conflict, NotFound, ValidationFailed
from controlplane.locks import AdvisoryLock
from provisioning.resources.contributions import tenant_declared_connections
from tenants.actors import SYSTEM, Actor
from tenants.audit import audit_record
from tenants.audit_actions import AuditAction
from tenants.choices import TENANT_GONE
from tenants.end_users import validate_end_user
from tenants.models import Operator, Tenant
from vault.services import credential_destroy, credential_put, credential_reveal
from vault.wrapped_rows import row_secret_read, row_secret_wrap, wrapped_rows_source

from . import oauth
from .choices import DISCONNECTED, SUPERSEDED, ConnectionStatus, ReauthReason, connection_credential_name
from .models import ConnectAttempt, Connection, OAuthClient
from .selectors import connection_get

__all__ = [
    "StartedConnection", "RefreshOutcome", "oauth_client_create", "connection_start", "connection_complete",
    "oauth_client_secrets", "connection_refresh", "connection_tokens_read",
    "ConnectionNotUsable", "ConnectionNotDeclared",
    "DeliveredConnection",
    "connection_deliver", "connection_deliver_answer", "connection_deliverable", "connections_refresh_due",
    "Disconnected", "connection_disconnect",
    "connections_disconnect_all",
]

log = logging.getLogger(__name__)

_REFUSED = "this authorization is unknown, already used, expired or not for this customer"


@dataclass(frozen=True)
class StartedConnection:
    authorization_url: str = field(repr=False)  # carries the state
    attempt: ConnectAttempt
    expires_at: datetime


@dataclass(frozen=True)
class RefreshOutcome:
    """``outcome``: ``refreshed``, ``fresh`` (not due), ``in_flight`` (another refresher holds it), ``inactive``
    (not active to begin with) or ``needs_reauth`` (this call found it could not be refreshed)."""

    connection: Connection
    outcome: str


@dataclass(frozen=True)
class _Tokens:
    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)


# --- OAuth clients ------------------------------------------------------------------------------------------------

def _secret_context(client: OAuthClient) -> str:
    # Bound to the client row: a wrapped secret copied onto another client's row does not unwrap.
    return f"oauth-client:{client.pk}"


def _client_secret(client: OAuthClient) -> str:
    return row_secret_read(client, _secret_context(client))


# A KEK rotation re-wraps the operators' client secrets after the data keys (registered in apps.py).
oauth_client_secrets = wrapped_rows_source("oauth_client_secrets", OAuthClient, _secret_context)


def oauth_client_create(*, operator: Operator, actor: Actor, provider: str, client_id: str, client_secret: str = "",
                        scopes: list[str] | None = None, issuer: str = "", authorization_endpoint: str = "",
                        token_endpoint: str = "", userinfo_endpoint: str = "",
                        revocation_endpoint: str = "", refresh_reuse_grace_s: int = 0,
                        end_user_fallback: bool = False) -> OAuthClient:
    """Register the operator's client at a provider: explicit endpoints, or OIDC discovery from ``issuer`` (explicit
    endpoints win over discovered ones). The secret is wrapped by the vault's key-encryption key at once.
    ``refresh_reuse_grace_s``: the provider's documented refresh-token reuse grace (0: none, never resend);
    ``end_user_fallback``: an end user without a connection of their own gets the tenant-wide one."""
    if issuer:
        found = oauth.discover(issuer)
        authorization_endpoint = authorization_endpoint or found.authorization_endpoint
        token_endpoint = token_endpoint or found.token_endpoint
        userinfo_endpoint = userinfo_endpoint or found.userinfo_endpoint
        revocation_endpoint = revocation_endpoint or found.revocation_endpoint
    if not authorization_endpoint or not token_endpoint:
        raise ValidationFailed("give authorization_endpoint and token_endpoint, or an issuer to discover them from")
    for name, url in (("authorization_endpoint", authorization_endpoint), ("token_endpoint", token_endpoint),
                      ("userinfo_endpoint", userinfo_endpoint), ("revocation_endpoint", revocation_endpoint)):
        if url:
            oauth.url_check(url, name=name)
    client = OAuthClient(operator=operator, provider=provider, client_id=client_id, issuer=issuer,
                         authorization_endpoint=authorization_endpoint, token_endpoint=token_endpoint,
                         userinfo_endpoint=userinfo_endpoint, revocation_endpoint=revocation_endpoint,
                         scopes=list(scopes or []), refresh_reuse_grace_s=refresh_reuse_grace_s,
                         end_user_fallback=end_user_fallback)
    if client_secret:
        row_secret_wrap(client, _secret_context(client), client_secret)
    try:
        with transaction.atomic():
            client.save()
            audit_record(actor=actor, action=AuditAction.OAUTH_CLIENT_CREATE, target=client, operator=operator,
                         data={"provider": provider, "issuer": issuer, "has_secret": bool(client_secret),
                               "refresh_reuse_grace_s": refresh_reuse_grace_s,
                               "end_user_fallback": end_user_fallback})
    except IntegrityError:
        raise Conflict(f"you already have an OAuth client for provider {provider!r}") from None
    return client


# --- The connect flow ---------------------------------------------------------------------------------------------

def _state_hash(state: str) -> str:
    return hashlib.sha256(state.encode()).hexdigest()


def connection_start(*, tenant: Tenant, oauth_client: OAuthClient, actor: Actor, redirect_uri: str,
                     scopes: list[str] | None = None, end_user: str | None = None) -> StartedConnection:
    """Begin an authorization-code flow with PKCE for ``tenant`` (and, when ``end_user`` names one, for that end
    user of it: the connection made will be theirs alone). The state is random, stored only as a hash with the
    tenant and end user it belongs to, single-use and expiring (``OAUTH_STATE_TTL_S``)."""
    end_user = validate_end_user(end_user)
    if tenant.status in TENANT_GONE:
        raise Conflict(f"tenant is {tenant.status}: it can no longer connect accounts")
    if oauth_client.operator_id != tenant.operator_id:
        raise NotFound("OAuth client not found")
    state = oauth.new_state()
    _, challenge = oauth.pkce_pair(state)
    expires_at = timezone.now() + timedelta(seconds=settings.OAUTH_STATE_TTL_S)
    wanted = list(scopes) if scopes is not None else list(oauth_client.scopes)
    with transaction.atomic():
        attempt = ConnectAttempt.objects.create(tenant=tenant, oauth_client=oauth_client,
                                                state_sha256=_state_hash(state), redirect_uri=redirect_uri,
                                                scopes=wanted, expires_at=expires_at, end_user=end_user)
        audit_record(actor=actor, action=AuditAction.CONNECTION_START, target=attempt, tenant=tenant,
                     data={"provider": oauth_client.provider, "scopes": wanted, "end_user": end_user})
    url = oauth.authorization_url(endpoint=oauth_client.authorization_endpoint, client_id=oauth_client.client_id,
                                  redirect_uri=redirect_uri, scopes=wanted, state=state, code_challenge=challenge)
    return StartedConnection(authorization_url=url, attempt=attempt, expires_at=expires_at)


def _attempt_claim(*, state: str, tenant: Tenant | None, actor: Actor, callback_url: str | None,
                   bound_end_user: str | None = None) -> ConnectAttempt:
    """Consume the attempt ``state`` names, under its row lock; committed before the code is exchanged, so a
    replayed callback (or two racing ones) finds it used. A state presented for another tenant, or at a callback
    other than the one the flow was started with (another operator's portal host: the provider only ever sends
    the browser to the redirect URI of the authorization request), is refused and does not consume it (the
    customer's own callback still works) but is recorded. ``bound_end_user``: the caller is a customer token of
    that end user, which may complete only that end user's flows (another's is refused the same way)."""
    if not isinstance(state, str) or not state or len(state) > 200:
        raise ValidationFailed(_REFUSED)
    refused = ""
    with transaction.atomic():  # the refusal's audit row commits with it; the error is raised after
        attempt = (ConnectAttempt.objects.select_for_update().select_related("tenant", "oauth_client")
                   .filter(state_sha256=_state_hash(state)).first())
        if attempt is None:
            raise ValidationFailed(_REFUSED)
        now = timezone.now()
        if tenant is not None and attempt.tenant_id != tenant.pk:
            refused = "state_of_another_tenant"
            audit_record(actor=actor, action=AuditAction.CONNECTION_REFUSED, tenant=tenant,
                         data={"reason": refused, "attempt_id": str(attempt.pk)})
            log.warning("security event: a connect state of tenant %s was presented for tenant %s",
                        attempt.tenant_id, tenant.pk)
        elif bound_end_user is not None and attempt.end_user != bound_end_user:
            refused = "state_of_another_end_user"
            audit_record(actor=actor, action=AuditAction.CONNECTION_REFUSED, tenant=attempt.tenant,
                         data={"reason": refused, "attempt_id": str(attempt.pk)})
            log.warning("security event: a connect state of tenant %s was presented by another end user's token",
                        attempt.tenant_id)
        elif callback_url is not None and attempt.redirect_uri != callback_url:
            refused = "callback_of_another_host"
            audit_record(actor=actor, action=AuditAction.CONNECTION_REFUSED, tenant=attempt.tenant,
                         data={"reason": refused, "attempt_id": str(attempt.pk)})
            log.warning("security event: a connect state of tenant %s was presented at another callback URL",
                        attempt.tenant_id)
        elif attempt.used_at is not None or attempt.expires_at <= now or attempt.tenant.status in TENANT_GONE:
            refused = "used" if attempt.used_at else ("expired" if attempt.expires_at <= now else "tenant_gone")
            audit_record(actor=actor, action=AuditAction.CONNECTION_REFUSED, tenant=attempt.tenant,
                         data={"reason": refused, "attempt_id": str(attempt.pk)})
        else:
            attempt.used_at = now
            attempt.save(update_fields=["used_at"])
    if refused:
        raise ValidationFailed(_REFUSED)
    return attempt


def _tokens_store(connection: Connection, tokens: _Tokens) -> None:
    credential_put(tenant=connection.tenant, name=connection_credential_name(connection.pk), actor=SYSTEM,
                   value=json.dumps({"access_token": tokens.access_token, "refresh_token": tokens.refresh_token}))


def connection_tokens_read(*, connection: Connection) -> _Tokens:
    """The connection's current tokens, opened from the tenant's vault. For the refresher (and, later, delivery
    to the tenant's own instance); never for an API answer."""
    raw = json.loads(credential_reveal(tenant=connection.tenant, name=connection_credential_name(connection.pk),
                                       actor=SYSTEM, audit=False))
    return _Tokens(access_token=raw["access_token"], refresh_token=raw.get("refresh_token"))


def _expiry(token_set: oauth.TokenSet, now: datetime) -> datetime | None:
    return now + timedelta(seconds=token_set.expires_in) if token_set.expires_in is not None else None


def connection_complete(*, state: str, code: str, actor: Actor = SYSTEM, tenant: Tenant | None = None,
                        callback_url: str | None = None, bound_end_user: str | None = None) -> Connection:
    """Finish the flow ``state`` started: exchange ``code`` (with the PKCE verifier) at the token endpoint, store
    the tokens in the tenant's vault and record the connection. ``tenant``: the customer the caller says this is
    for (the operator-API completion); the callback passes none and the state alone names it, but passes
    ``callback_url``, the URL it was served at, which must be the flow's redirect URI.

    The connection belongs to the end user the flow was started for (or to the tenant as a whole), and replaces
    the active one of the same tenant, provider and end user (``_supersede``): one is in use per end user."""
    attempt = _attempt_claim(state=state, tenant=tenant, actor=actor, callback_url=callback_url,
                             bound_end_user=bound_end_user)
    if not isinstance(code, str) or not code or len(code) > 2000:
        raise ValidationFailed("the provider's answer has no authorization code")
    client = attempt.oauth_client
    verifier, _ = oauth.pkce_pair(state)
    token_set = oauth.exchange_code(endpoint=client.token_endpoint, client_id=client.client_id,
                                    client_secret=_client_secret(client), code=code,
                                    redirect_uri=attempt.redirect_uri, code_verifier=verifier)
    account_id = (oauth.userinfo_subject(endpoint=client.userinfo_endpoint, access_token=token_set.access_token)
                  if client.userinfo_endpoint else "")
    now = timezone.now()
    granted = token_set.scope.split() if token_set.scope is not None else list(attempt.scopes)
    for last_try in (False, True):
        try:
            with transaction.atomic():
                _supersede(attempt)
                connection = Connection.objects.create(
                    tenant=attempt.tenant, oauth_client=client, provider=client.provider, end_user=attempt.end_user,
                    account_id=account_id, scopes=granted, status=ConnectionStatus.ACTIVE,
                    expires_at=_expiry(token_set, now), last_refreshed_at=None)
                _tokens_store(connection, _Tokens(token_set.access_token, token_set.refresh_token))
                audit_record(actor=actor, action=AuditAction.CONNECTION_CREATE, target=connection,
                             tenant=attempt.tenant, data={"provider": client.provider, "account_id": account_id,
                                                          "scopes": granted, "end_user": attempt.end_user})
            return connection
        except IntegrityError:
            # A concurrent completion of the same tenant, provider and end user committed first: supersede it.
            if last_try:
                raise
    raise AssertionError("unreachable")


def _supersede(attempt: ConnectAttempt) -> None:
    """The active connection of the attempt's tenant, provider and end user, replaced: ``revoked`` with reason
    ``superseded`` and its tokens deleted from the vault, in the caller's transaction. Not revoked at the provider:
    the customer just granted access again, and a provider may end the new grant with the old one (Google revokes
    every token of the user's grant to the app). A refresh of the old one in flight finds it inactive at its
    commit and stores nothing."""
    for old in (Connection.objects.select_for_update().select_related("tenant")
                .filter(tenant=attempt.tenant, provider=attempt.oauth_client.provider, end_user=attempt.end_user,
                        status=ConnectionStatus.ACTIVE)):
        old.status, old.status_reason, old.refresh_sent_at, old.refresh_resent_at = (
            ConnectionStatus.REVOKED, SUPERSEDED, None, None)
        old.save(update_fields=["status", "status_reason", "refresh_sent_at", "refresh_resent_at", "updated_at"])
        credential_destroy(tenant=old.tenant, name=connection_credential_name(old.pk), actor=SYSTEM)
        audit_record(actor=SYSTEM, action=AuditAction.CONNECTION_DISCONNECT, target=old, tenant=old.tenant,
                     data={"provider": old.provider, "provider_revocation": "superseded"})


# --- Refresh ------------------------------------------------------------------------------------------------------

def _needs_reauth(connection_id: object, reason: ReauthReason) -> Connection:
    with transaction.atomic():
        connection = Connection.objects.select_for_update().select_related("tenant").get(pk=connection_id)
        connection.status = ConnectionStatus.NEEDS_REAUTH
        connection.status_reason = reason.value
        connection.refresh_sent_at = connection.refresh_resent_at = None
        connection.save(update_fields=["status", "status_reason", "refresh_sent_at", "refresh_resent_at",
                                       "updated_at"])
        audit_record(actor=SYSTEM, action=AuditAction.CONNECTION_NEEDS_REAUTH, target=connection,
                     tenant=connection.tenant, data={"provider": connection.provider, "reason": reason.value})
    return connection


def _clear_sent(connection_id: object) -> None:
    Connection.objects.filter(pk=connection_id).update(refresh_sent_at=None, refresh_resent_at=None,
                                                       updated_at=timezone.now())


def _resend_allowed(connection_id: object) -> bool:
    """After a refresh's answer was lost (the refresher died, or the request reached the provider and no answer
    came back): whether the client's ``refresh_reuse_grace_s`` lets the same refresh token be sent once more. Only
    within the grace counted from the first send (``refresh_sent_at``), and only once per refresh token: the
    resend is committed (``refresh_resent_at``) before it leaves, under the row lock, so a refresher that finds it
    set knows the one retry is spent. The caller holds the refresh lock."""
    with transaction.atomic():
        connection = Connection.objects.select_for_update().select_related("oauth_client").get(pk=connection_id)
        grace = connection.oauth_client.refresh_reuse_grace_s
        sent = connection.refresh_sent_at
        if (connection.status != ConnectionStatus.ACTIVE or grace <= 0 or sent is None
                or connection.refresh_resent_at is not None
                or timezone.now() - sent >= timedelta(seconds=grace)):
            return False
        connection.refresh_resent_at = timezone.now()
        connection.save(update_fields=["refresh_resent_at", "updated_at"])
    log.info("connection %s: a refresh's answer was lost; resending it once within the provider's reuse grace",
             connection_id)
    return True


def connection_refresh(*, connection_id: object, ahead_s: float | None = None) -> RefreshOutcome:
    """Refresh the connection's access token if it expires within ``ahead_s`` (``OAUTH_REFRESH_AHEAD_S``).

    Single-flight across processes (see the module docstring). A provider answering ``invalid_grant`` ends in
    ``needs_reauth``; so does a refresh whose answer may have been lost after it reached the provider, unless the
    client's ``refresh_reuse_grace_s`` allows sending the same refresh token once more (``_resend_allowed``).

    Call it outside any transaction (a task, a sweep, a request handler without ATOMIC_REQUESTS): the marker's
    commit before the request leaves is what makes an interrupted refresh visible to the next refresher.
    """
    ahead = settings.OAUTH_REFRESH_AHEAD_S if ahead_s is None else ahead_s
    with AdvisoryLock(f"connection-refresh:{connection_id}") as lock:
        if not lock.held:
            return RefreshOutcome(Connection.objects.get(pk=connection_id), "in_flight")
        with transaction.atomic():
            connection = (Connection.objects.select_for_update().select_related("tenant", "oauth_client")
                          .get(pk=connection_id))
            if connection.status != ConnectionStatus.ACTIVE:
                return RefreshOutcome(connection, "inactive")
            if connection.refresh_sent_at is not None:
                # We hold the lock, so its last holder is gone: it sent a refresh and never committed the answer.
                interrupted = True
                tokens = connection_tokens_read(connection=connection)
            else:
                interrupted = False
                due = (connection.expires_at is not None
                       and connection.expires_at <= timezone.now() + timedelta(seconds=ahead))
                if not due:
                    return RefreshOutcome(connection, "fresh")
                tokens = connection_tokens_read(connection=connection)
                if tokens.refresh_token:
                    connection.refresh_sent_at = timezone.now()
                    connection.save(update_fields=["refresh_sent_at", "updated_at"])
        if interrupted and not (tokens.refresh_token and _resend_allowed(connection_id)):
            return RefreshOutcome(_needs_reauth(connection_id, ReauthReason.REFRESH_INTERRUPTED), "needs_reauth")
        if not tokens.refresh_token:
            return RefreshOutcome(_needs_reauth(connection_id, ReauthReason.NO_REFRESH_TOKEN), "needs_reauth")
        # Committed: from here on, the marker says a refresh token may be spent.
        client = connection.oauth_client
        while True:
            try:
                token_set = oauth.refresh(endpoint=client.token_endpoint, client_id=client.client_id,
                                          client_secret=_client_secret(client), refresh_token=tokens.refresh_token)
                break
            except oauth.OAuthProviderError as refused:
                if refused.error == "invalid_grant":
                    return RefreshOutcome(_needs_reauth(connection_id, ReauthReason.INVALID_GRANT), "needs_reauth")
                _clear_sent(connection_id)  # an error answer rotates nothing: a later try may send the same token
                raise
            except oauth.OAuthTransportError as lost:
                if not lost.sent:
                    _clear_sent(connection_id)
                    raise
                if not _resend_allowed(connection_id):
                    return RefreshOutcome(_needs_reauth(connection_id, ReauthReason.REFRESH_INTERRUPTED),
                                          "needs_reauth")
        now = timezone.now()
        with transaction.atomic():
            connection = Connection.objects.select_for_update().select_related("tenant").get(pk=connection_id)
            resent = connection.refresh_resent_at is not None
            if connection.status != ConnectionStatus.ACTIVE:
                # Superseded by a reconnect (or disconnected) while the request was out: these tokens are of a
                # connection no longer in use, and its stored ones were deleted. Nothing is written back.
                return RefreshOutcome(connection, "inactive")
            # Without a new refresh token the provider does not rotate: the one we hold stays valid.
            _tokens_store(connection, _Tokens(token_set.access_token, token_set.refresh_token or tokens.refresh_token))
            connection.expires_at = _expiry(token_set, now)
            connection.last_refreshed_at = now
            connection.refresh_sent_at = connection.refresh_resent_at = None
            if token_set.scope is not None:
                connection.scopes = token_set.scope.split()
            connection.save(update_fields=["expires_at", "last_refreshed_at", "refresh_sent_at", "refresh_resent_at",
                                           "scopes", "updated_at"])
            # ``resent``: this answer came to the one resend the provider's reuse grace allowed.
            audit_record(actor=SYSTEM, action=AuditAction.CONNECTION_REFRESH, target=connection,
                         tenant=connection.tenant, data={"provider": connection.provider,
                                                         "rotated": token_set.refresh_token is not None,
                                                         "resent": resent})
        return RefreshOutcome(connection, "refreshed")


# --- Delivery to the tenant's own instance ------------------------------------------------------------------------

class ConnectionNotUsable(ApplicationError):
    """The tenant has this provider connected, but not usably (``needs_reauth`` or disconnected): only the customer
    connecting again mends it. The instance blocks its task on it and resumes by itself after a reconnect."""

    status_code = 409
    title = "Connection needs the customer"
    type_slug = "connection-needs-reauth"

    def __init__(self, connection: Connection) -> None:
        super().__init__(f"the {connection.provider} connection is {connection.status}"
                         f" ({connection.status_reason or 'no reason recorded'}): the customer must connect it again",
                         extra={"provider": connection.provider, "connection_status": connection.status,
                                "reason": connection.status_reason})


class ConnectionNotDeclared(ApplicationError):
    """The agents of the release the tenant runs did not declare this provider (``Agent(connections=[...])``): its
    instance is never handed that connection, whether or not the customer connected it."""

    status_code = 403
    title = "Connection not declared by the agent"
    type_slug = "connection-not-declared"

    def __init__(self, provider: str) -> None:
        super().__init__(f"the agents of this release do not declare the connection {provider[:60]!r}: add it to "
                         "Agent(connections=[...]) and ship a new release", extra={"provider": provider[:60]})


def _declared(tenant: Tenant, provider: str) -> bool:
    """Whether the tenant's instance may be handed ``provider``'s connection: its release's agents declared it. A
    tenant on no release runs the runtime's installed agents (platform code, not the operator's upload), which
    declare nothing to check against: every connection of the tenant is theirs to use."""
    declared = tenant_declared_connections(tenant)
    return declared is None or provider in declared


@dataclass(frozen=True)
class DeliveredConnection:
    connection: Connection
    access_token: str = field(repr=False)


# The conversations app records which end user each message and task acts for (a sibling app: a dotted string,
# docs/architecture.md). The task id is the inbox item's id.
_TASK_END_USER = "conversations.selectors.inbox_item_end_user"


def _task_end_user(tenant: Tenant, task: object) -> str | None:
    """The end user the control plane recorded for the instance's task ``task`` (its id), from the operator's own
    API call that sent it: never a value the instance chose. None when no task is named or the task acts for no
    end user (a task sent without one, a schedule's, one the agent started itself): the tenant's own connection."""
    if task is None or task == "":
        return None
    end_user: str | None = import_string(_TASK_END_USER)(tenant=tenant, item_id=task)
    return end_user


def _latest(tenant: Tenant, provider: str, *, end_user: str | None, active_only: bool) -> Connection | None:
    # A reconnect makes a new row; the newest active one is the one in use, the older ones stay as history.
    found = Connection.objects.filter(tenant=tenant, provider=provider, end_user=end_user)
    if active_only:
        found = found.filter(status=ConnectionStatus.ACTIVE)
    return found.select_related("tenant").order_by("-created_at").first()


def _in_use(tenant: Tenant, provider: str, end_user: str | None) -> tuple[Connection | None, Connection | None]:
    """(the active connection a task of ``end_user`` uses, else the newest unusable one to name in a refusal). An
    end user's task uses that end user's connection; the tenant-wide one only when the operator's OAuth client for
    the provider says ``end_user_fallback`` (never another end user's)."""
    active = _latest(tenant, provider, end_user=end_user, active_only=True)
    if active is None and end_user is not None and OAuthClient.objects.filter(
            operator_id=tenant.operator_id, provider=provider, end_user_fallback=True).exists():
        active = _latest(tenant, provider, end_user=None, active_only=True)
    if active is not None:
        return active, None
    return None, _latest(tenant, provider, end_user=end_user, active_only=False)


def connection_deliverable(*, tenant: Tenant, provider: object, task: object = None) -> bool:
    """Whether ``connection_deliver`` would hand out a token now, without reading it: how an instance finds out
    that a connection its blocked task waits for was connected again. Nothing is refreshed or audited."""
    return (isinstance(provider, str) and tenant.status not in TENANT_GONE and _declared(tenant, provider)
            and _in_use(tenant, provider, _task_end_user(tenant, task))[0] is not None)


def connection_deliver(*, tenant: Tenant, provider: object, actor: Actor, task: object = None) -> DeliveredConnection:
    """A current access token of ``tenant``'s connection to ``provider``, for that tenant's own instance.

    Confined to ``tenant``: the lookup never leaves it, so another tenant's connection is not addressable (a name
    is a provider, never a connection id). A token due within ``OAUTH_REFRESH_AHEAD_S`` is refreshed first under
    ``connection_refresh``'s single-flight lock; while another refresher holds it, the current token is handed out
    if it has not expired, else we wait for that refresh (up to ``OAUTH_HTTP_TIMEOUT_S``). Every delivery and
    refusal is audited, without the token (deliveries coalesced: ``_delivery_audit``). ``ConnectionNotDeclared``
    (403) when the agents of the tenant's release did not declare the provider (checked first: whether the customer
    connected it is not told), ``ConnectionNotUsable`` (409) when the connection needs the customer, NotFound when
    there is none.

    ``task``: the id of the instance's task asking. When the control plane recorded an end user for it (the
    operator's API call that sent the message or task named one), the connection is that end user's (``_in_use``);
    the instance cannot name an end user, only its task."""
    if not isinstance(provider, str) or tenant.status in TENANT_GONE:
        raise NotFound("connection not found")
    if not _declared(tenant, provider):
        audit_record(actor=actor, action=AuditAction.CONNECTION_DELIVER_REFUSED, tenant=tenant,
                     data={"provider": provider[:60], "reason": "not_declared"})
        raise ConnectionNotDeclared(provider)
    end_user = _task_end_user(tenant, task)
    connection, other = _in_use(tenant, provider, end_user)
    if connection is None:
        audit_record(actor=actor, action=AuditAction.CONNECTION_DELIVER_REFUSED, tenant=tenant,
                     data={"provider": provider[:60], "reason": other.status if other else "not_connected",
                           "end_user": end_user})
        if other is not None:
            raise ConnectionNotUsable(other)
        # Names the provider, not the person: the instance is told to wait for a connection, not whose.
        raise NotFound(f"no {provider[:60]!r} connection" + (" for this task's end user" if end_user else ""))
    deadline = time.monotonic() + settings.OAUTH_HTTP_TIMEOUT_S
    # The steady state (the sweep keeps tokens fresh): not due and no refresh marker on the row just read, so the
    # refresh lock is not taken at all. A refresh racing this read only makes the token handed out the previous
    # one, still valid past OAUTH_REFRESH_AHEAD_S, as connection_refresh's own "in_flight" answer would.
    fresh = (connection.refresh_sent_at is None and connection.expires_at is not None
             and connection.expires_at > timezone.now() + timedelta(seconds=settings.OAUTH_REFRESH_AHEAD_S))
    while True:
        if fresh:
            outcome = RefreshOutcome(connection, "fresh")
            break
        try:
            outcome = connection_refresh(connection_id=connection.pk)
        except ApplicationError:
            # The provider refused (not invalid_grant) or could not be reached, and nothing was rotated: the token
            # we hold is still good until it expires, so hand it out; past that, the instance waits ("not now").
            connection.refresh_from_db()
            if connection.expires_at is not None and connection.expires_at <= timezone.now():
                raise
            outcome = RefreshOutcome(connection, "refresh_failed")
        connection = outcome.connection
        if connection.status != ConnectionStatus.ACTIVE:
            audit_record(actor=actor, action=AuditAction.CONNECTION_DELIVER_REFUSED, target=connection, tenant=tenant,
                         data={"provider": provider, "reason": connection.status})
            raise ConnectionNotUsable(connection)
        expired = connection.expires_at is not None and connection.expires_at <= timezone.now()
        if outcome.outcome != "in_flight" or not expired or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # another process is refreshing an expired token: its answer is moments away
    tokens = connection_tokens_read(connection=connection)
    _delivery_audit(connection, actor=actor, refreshed=outcome.outcome == "refreshed")
    return DeliveredConnection(connection=connection, access_token=tokens.access_token)


def _delivery_audit(connection: Connection, *, actor: Actor, refreshed: bool) -> None:
    """At most one ``connection.deliver`` row per connection per ``OAUTH_DELIVERY_AUDIT_INTERVAL_S``: a step calling
    ``access_token()`` in a loop would otherwise write a row per call. A delivery inside the window only counts
    itself on the connection (one UPDATE, no row lock taken while it is free); the next row written carries that
    count as ``coalesced``, so no delivery goes unaccounted. A delivery that refreshed always gets its row (the
    refresh itself is audited as ``connection.refresh`` too)."""
    interval = settings.OAUTH_DELIVERY_AUDIT_INTERVAL_S
    now = timezone.now()
    if interval > 0 and not refreshed and Connection.objects.filter(
            pk=connection.pk, delivery_audited_at__gt=now - timedelta(seconds=interval)).update(
            deliveries_unaudited=F("deliveries_unaudited") + 1):
        return
    with transaction.atomic():
        counts = (Connection.objects.select_for_update().filter(pk=connection.pk)
                  .values_list("delivery_audited_at", "deliveries_unaudited").first())
        audited_at, coalesced = counts if counts is not None else (None, 0)
        if (interval > 0 and not refreshed and audited_at is not None
                and audited_at > now - timedelta(seconds=interval)):  # a racing delivery wrote the row just now
            Connection.objects.filter(pk=connection.pk).update(deliveries_unaudited=F("deliveries_unaudited") + 1)
            return
        Connection.objects.filter(pk=connection.pk).update(delivery_audited_at=now, deliveries_unaudited=0)
        audit_record(actor=actor, action=AuditAction.CONNECTION_DELIVER, target=connection, tenant=connection.tenant,
                     data={"provider": connection.provider, "refreshed": refreshed, "coalesced": coalesced})


def connection_deliver_answer(*, tenant: Tenant, provider: object, actor: Actor,
                              task: object = None) -> dict[str, Any]:
    """``connection_deliver`` as the internal API's answer: the one place a connection's token leaves the vault."""
    delivered = connection_deliver(tenant=tenant, provider=provider, actor=actor, task=task)
    connection = delivered.connection
    return {"provider": connection.provider, "access_token": delivered.access_token,
            "expires_at": connection.expires_at.isoformat() if connection.expires_at else None,
            "account_id": connection.account_id, "scopes": list(connection.scopes)}


# --- The refresh sweep --------------------------------------------------------------------------------------------

def connections_refresh_due(*, window_s: float | None = None, limit: int = 1000) -> dict[str, int]:
    """Refresh every active connection whose access token expires within ``window_s``
    (``OAUTH_REFRESH_SWEEP_WINDOW_S``), soonest first: the beat job, so an instance asking for a token rarely waits
    on a provider. Each goes through ``connection_refresh`` (its advisory lock and marker): one held by a
    delivery or another sweep is counted ``in_flight`` and left to it. Counts by outcome; one connection's
    provider failing does not stop the others."""
    window = settings.OAUTH_REFRESH_SWEEP_WINDOW_S if window_s is None else window_s
    due = list(Connection.objects.filter(status=ConnectionStatus.ACTIVE, expires_at__isnull=False,
                                         expires_at__lte=timezone.now() + timedelta(seconds=window))
               .order_by("expires_at").values_list("pk", flat=True)[:limit])
    counts: dict[str, int] = {}
    for pk in due:
        try:
            outcome = connection_refresh(connection_id=pk, ahead_s=window).outcome
        except ApplicationError as failed:  # the provider refused or was unreachable: the next run tries again
            outcome = "failed"
            log.warning("connection %s not refreshed: %s", pk, failed.type_slug)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


# --- Disconnect ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Disconnected:
    """``provider_revocation``: ``revoked`` (RFC 7009 answered 200), ``unsupported`` (the client has no revocation
    endpoint), ``failed`` (it refused or did not answer: the tokens are deleted here anyway, and stay valid at the
    provider until they expire or the customer removes the app there) or ``nothing_left`` (already deleted)."""

    connection: Connection
    provider_revocation: str


def connection_disconnect(*, tenant: Tenant, connection_id: object, actor: Actor) -> Disconnected:
    """Disconnect: the connection stops being delivered (``revoked``, reason ``disconnected``, committed first),
    its tokens are revoked at the provider (RFC 7009) where the client has a revocation endpoint, then every
    version of them is deleted from the tenant's vault (``credential_destroy``). Retry-safe: a call killed half
    way is finished by the next one.

    Holds the refresh lock, so no refresh is between sending and committing while the tokens are revoked and
    deleted (a refresh committing afterwards would write live tokens back)."""
    connection = connection_get(tenant=tenant, connection_id=connection_id)
    with AdvisoryLock(f"connection-refresh:{connection.pk}") as lock:
        if not lock.held:
            raise Conflict("a refresh of this connection is under way: try again in a moment")
        with transaction.atomic():
            connection = Connection.objects.select_for_update().select_related("tenant", "oauth_client").get(
                pk=connection.pk)
            connection.status = ConnectionStatus.REVOKED
            connection.status_reason = DISCONNECTED
            connection.refresh_sent_at = connection.refresh_resent_at = None
            connection.save(update_fields=["status", "status_reason", "refresh_sent_at", "refresh_resent_at",
                                           "updated_at"])
        try:
            tokens: _Tokens | None = connection_tokens_read(connection=connection)
        except NotFound:
            tokens = None
        client = connection.oauth_client
        if tokens is None:
            revocation = "nothing_left"
        elif not client.revocation_endpoint:
            revocation = "unsupported"
        else:
            revocation = "revoked"
            # The refresh token first: revoking it ends the grant (RFC 7009 2.1), then the access token in case the
            # provider keeps that alive on its own.
            hinted = [(tokens.refresh_token, "refresh_token")] if tokens.refresh_token else []
            for token, hint in [*hinted, (tokens.access_token, "access_token")]:
                try:
                    oauth.revoke(endpoint=client.revocation_endpoint, client_id=client.client_id,
                                 client_secret=_client_secret(client), token=token, token_type_hint=hint)
                except (oauth.OAuthProviderError, oauth.OAuthTransportError) as failed:
                    revocation = "failed"
                    log.warning("connection %s: the provider's revocation failed: %s", connection.pk,
                                failed.type_slug)
                    break
        with transaction.atomic():
            destroyed = credential_destroy(tenant=connection.tenant, name=connection_credential_name(connection.pk),
                                           actor=SYSTEM)
            audit_record(actor=actor, action=AuditAction.CONNECTION_DISCONNECT, target=connection,
                         tenant=connection.tenant,
                         data={"provider": connection.provider, "provider_revocation": revocation,
                               "versions_deleted": destroyed})
    return Disconnected(connection=connection, provider_revocation=revocation)


def connections_disconnect_all(*, tenant: Tenant, actor: Actor) -> dict[str, Any]:
    """Every connection of a tenant being deprovisioned, disconnected (deprovisioning's hook, run before its keys
    are retired). Idempotent: an already disconnected one finds nothing left. Counts for the step's record."""
    outcomes: dict[str, int] = {}
    for pk in list(Connection.objects.filter(tenant=tenant).values_list("pk", flat=True)):
        done = connection_disconnect(tenant=tenant, connection_id=pk, actor=actor)
        outcomes[done.provider_revocation] = outcomes.get(done.provider_revocation, 0) + 1
    return outcomes
