"""OAuth clients (per operator) and a customer's connections: thin views over ``connections.services`` and
``connections.selectors``. Reads need ``tenants:read``; writes ``credentials:write`` (a client secret and a
customer's tokens are credentials). Lookups go through the caller's operator: another's objects are a 404. The
connect flow (list, start, complete) also takes a customer token of that very customer, with ``connections:read``
or ``connections:write``: the operator's front end connects the customer's account itself."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils.module_loading import import_string
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.errors import NotFound
from controlplane.throttles import CredentialsThrottle, OperatorThrottle
from tenants.actors import Actor
from tenants.api.authentication import OperatorPrincipal
from tenants.api.permissions import scope_held
from tenants.api.views import ScopedView
from tenants.choices import TokenScope
from tenants.end_users import END_USER_PATTERN
from tenants.selectors import tenant_get

from ..selectors import connection_list, oauth_client_by_provider, oauth_client_get, oauth_client_list
from ..services import connection_complete, connection_disconnect, connection_start, oauth_client_create
from .serializers import (
    ConnectionCompleteInput,
    ConnectionDisconnectedOutput,
    ConnectionOutput,
    ConnectionStartedOutput,
    ConnectionStartInput,
    OAuthClientCreateInput,
    OAuthClientOutput,
)

S = TokenScope


class ConnectionsView(ScopedView):
    default_scope = S.CREDENTIALS_WRITE
    throttle_classes = [OperatorThrottle, CredentialsThrottle]


# Customer tokens belong to the conversations app, a sibling of this one (docs/architecture.md: siblings hear of
# each other through dotted strings): its authentication, its refusal audit and its actor.
_CUSTOMER = "conversations.api.authentication.CustomerTokenAuthentication"
_OPERATOR_ONLY = "conversations.api.authentication.OperatorEndpointAuthentication"


class OperatorOrCustomerScope(permissions.BasePermission):
    """An operator token with the view's operator scope, or a customer token of this very tenant with
    ``customer_scopes``' scope for the method (``connections:read`` / ``connections:write``). A customer token
    naming another tenant is a 404 and an audit row, whatever its scopes."""

    message = "this token lacks the scope this request needs"

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if isinstance(principal, OperatorPrincipal):
            return scope_held(self, view.required_scope, principal.token.scopes)
        token, tenant = getattr(principal, "token", None), getattr(principal, "tenant", None)
        if token is None or tenant is None:
            return False
        if str(view.kwargs.get("tenant_id", "")).lower() != str(tenant.pk):
            import_string("conversations.tokens.customer_token_refused")(
                token=token, reason="another tenant", path=request.path, method=request.method)
            raise NotFound("tenant not found")
        method = request.method if request.method != "HEAD" else "GET"
        return scope_held(self, view.customer_scopes.get(method), principal.scopes)


class CustomerConnectView(ConnectionsView):
    """The connect flow, for the operator's back end or for its front end holding a customer token."""

    authentication_classes = [import_string(_CUSTOMER), import_string(_OPERATOR_ONLY)]
    permission_classes = [OperatorOrCustomerScope]
    customer_scopes: dict[str, str] = {}

    def operator(self, request: Request) -> Any:
        return request.user.operator

    def actor(self, request: Request) -> Actor:
        if isinstance(request.user, OperatorPrincipal):
            return Actor.for_token(request.auth)
        actor: Actor = import_string("conversations.tokens.customer_token_actor")(request.user.token)
        return actor

    def bound_end_user(self, request: Request) -> str | None:
        """The end user the caller's customer token is bound to; None for an operator token or a token of the
        customer as a whole."""
        if isinstance(request.user, OperatorPrincipal):
            return None
        bound: str | None = request.user.token.end_user
        return bound

    def end_user(self, request: Request, named: object) -> str | None:
        """The end user this request acts for: its customer token's (another named: 400), else the one named."""
        token = None if isinstance(request.user, OperatorPrincipal) else request.user.token
        end_user: str | None = import_string("conversations.tokens.customer_token_end_user")(token, named)
        return end_user


class OAuthClientListCreateView(ConnectionsView):
    scopes = {"GET": S.TENANTS_READ, "POST": S.CREDENTIALS_WRITE}

    @extend_schema(operation_id="oauth_clients_list", tags=["connections"], responses=OAuthClientOutput(many=True),
                   description="Your OAuth clients, by provider. Never a client secret.")
    def get(self, request: Request) -> Response:
        return Response(OAuthClientOutput(oauth_client_list(operator=self.operator(request)), many=True).data)

    @extend_schema(operation_id="oauth_clients_create", tags=["connections"], request=OAuthClientCreateInput,
                   responses={201: OAuthClientOutput},
                   description="Register your client at a provider: explicit endpoints, or an OIDC `issuer` to "
                               "discover them from. Endpoints must be https. The secret is write-only.")
    def post(self, request: Request) -> Response:
        body = self.body(request, OAuthClientCreateInput)
        client = oauth_client_create(operator=self.operator(request), actor=self.actor(request), **body)
        return Response(OAuthClientOutput(client).data, status=status.HTTP_201_CREATED)


class OAuthClientDetailView(ConnectionsView):
    scopes = {"GET": S.TENANTS_READ}

    @extend_schema(operation_id="oauth_clients_retrieve", tags=["connections"], responses=OAuthClientOutput,
                   description="One of your OAuth clients. Never its secret.")
    def get(self, request: Request, client_id: str) -> Response:
        return Response(OAuthClientOutput(oauth_client_get(operator=self.operator(request), client_id=client_id)).data)


class ConnectionListStartView(CustomerConnectView):
    scopes = {"GET": S.TENANTS_READ, "POST": S.CREDENTIALS_WRITE}
    customer_scopes = {"GET": S.CONNECTIONS_READ, "POST": S.CONNECTIONS_WRITE}

    extra_query_params = ("end_user",)

    @extend_schema(operation_id="connections_list", tags=["connections"], responses=ConnectionOutput(many=True),
                   parameters=[OpenApiParameter("end_user", str, required=False, pattern=END_USER_PATTERN,
                                                description="Only this end user's connections.")],
                   description="The customer's connected accounts: provider, end user, account id, scopes granted, "
                               "status, expiry and last refresh. Never a token. A customer token bound to an end "
                               "user sees that end user's connections and the tenant-wide ones, no other end "
                               "user's.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        bound = self.bound_end_user(request)
        named = request.query_params.get("end_user")
        found = connection_list(tenant=tenant, end_user=self.end_user(request, named) if named is not None else None,
                                visible_to=bound)
        return Response(ConnectionOutput(found, many=True).data)

    @extend_schema(operation_id="connections_start", tags=["connections"], request=ConnectionStartInput,
                   responses={201: ConnectionStartedOutput},
                   description="Start connecting an account of the customer's (authorization code with PKCE). Send "
                               "the customer's browser to `authorization_url`; the provider returns it to this "
                               "control plane's `/oauth/callback`, which records the connection. An operator "
                               "token (`credentials:write`) or a customer token of this customer "
                               "(`connections:write`).")
    def post(self, request: Request, tenant_id: str) -> Response:
        operator = self.operator(request)
        tenant = tenant_get(operator=operator, tenant_id=tenant_id, live=True)
        body = self.body(request, ConnectionStartInput)
        client = oauth_client_by_provider(operator=operator, provider=body["provider"])
        started = connection_start(tenant=tenant, oauth_client=client, actor=self.actor(request),
                                   redirect_uri=request.build_absolute_uri(reverse("oauth-callback")),
                                   scopes=body.get("scopes"), end_user=self.end_user(request, body.get("end_user")))
        response = Response(ConnectionStartedOutput(started).data, status=status.HTTP_201_CREATED)
        response["Cache-Control"] = "no-store"  # the URL carries the flow's state
        return response


class ConnectionCompleteView(CustomerConnectView):
    scopes = {"POST": S.CREDENTIALS_WRITE}
    customer_scopes = {"POST": S.CONNECTIONS_WRITE}

    @extend_schema(operation_id="connections_complete", tags=["connections"], request=ConnectionCompleteInput,
                   responses={201: ConnectionOutput},
                   description="For a front end of yours that received the provider's redirect itself: hand over "
                               "its `state` and `code`. The state must be one started for this customer, unused "
                               "and unexpired.")
    def post(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id, live=True)
        body = self.body(request, ConnectionCompleteInput)
        connection = connection_complete(state=body["state"], code=body["code"], tenant=tenant,
                                         actor=self.actor(request), bound_end_user=self.bound_end_user(request))
        return Response(ConnectionOutput(connection).data, status=status.HTTP_201_CREATED)


class ConnectionDetailView(ConnectionsView):
    scopes = {"DELETE": S.CREDENTIALS_WRITE}

    @extend_schema(operation_id="connections_disconnect", tags=["connections"],
                   responses={200: ConnectionDisconnectedOutput},
                   description="Disconnect a customer's account: the instance can no longer get its token, the "
                               "tokens are revoked at the provider (RFC 7009) when your client has a revocation "
                               "endpoint, and deleted from the customer's vault. Safe to repeat.")
    def delete(self, request: Request, tenant_id: str, connection_id: str) -> Response:
        # Not live=True: a suspended customer's accounts can still be disconnected.
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        done = connection_disconnect(tenant=tenant, connection_id=connection_id, actor=self.actor(request))
        return Response(ConnectionDisconnectedOutput(done).data)
