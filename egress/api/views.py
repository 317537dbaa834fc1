"""Egress rules and decisions API views: thin; each validates input, calls one service or selector.

Scopes: ``tenants:read`` to read rules and a tenant's decision log, ``tenants:write`` to add or delete a rule (an
allow-list is part of how the operator runs its customers). Everything is looked up through the caller's
operator: another operator's rule, tenant or release is a 404.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.pagination import BoundedCursorPagination
from egress.selectors import decision_list, rule_get, rule_list
from egress.services import rule_create, rule_delete
from releases.selectors import release_get
from tenants.api.views import ScopedView
from tenants.choices import TokenScope
from tenants.selectors import tenant_get

from .serializers import DecisionOutput, DecisionQuery, RuleCreateInput, RuleOutput, RuleQuery, cursor_page

S = TokenScope
_NO_SUCH_SCOPE = OpenApiResponse(description="The body names no tenant or release of yours (another operator's is "
                                             "indistinguishable from a missing one).")


class EgressView(ScopedView):
    default_scope = S.TENANTS_WRITE


class RuleListCreateView(EgressView):
    scopes = {"GET": S.TENANTS_READ, "POST": S.TENANTS_WRITE}
    extra_query_params = tuple(RuleQuery().fields)

    @extend_schema(operation_id="egress_rules_list", tags=["egress"], parameters=[RuleQuery],
                   responses=RuleOutput(many=True),
                   description="Your egress allow-list: the hosts your customers' agents may reach through their "
                               "egress proxy, for all of them, per release or per customer.")
    def get(self, request: Request) -> Response:
        q = self.query(request, RuleQuery)
        rules = rule_list(operator=self.operator(request),
                          tenant_id=str(q["tenant"]) if q.get("tenant") else None,
                          release_id=str(q["release"]) if q.get("release") else None)
        return Response(RuleOutput(rules, many=True).data)

    @extend_schema(operation_id="egress_rules_create", tags=["egress"], request=RuleCreateInput,
                   responses={201: RuleOutput, 404: _NO_SUCH_SCOPE},
                   description="Allow one more host (and `port`); running proxies apply it within "
                               "`EGRESS_RULES_REFRESH_S`. 409 if the same rule exists in the same scope.")
    def post(self, request: Request) -> Response:
        operator = self.operator(request)
        body = self.body(request, RuleCreateInput)
        tenant = tenant_get(operator=operator, tenant_id=body["tenant"]) if body["tenant"] else None
        release = release_get(operator=operator, release_id=body["release"]) if body["release"] else None
        made = rule_create(operator=operator, host=body["host"], port=body["port"], tenant=tenant, release=release,
                           note=body["note"], actor=self.actor(request))
        return Response(RuleOutput(made).data, status=status.HTTP_201_CREATED)


class RuleDetailView(EgressView):
    scopes = {"GET": S.TENANTS_READ, "DELETE": S.TENANTS_WRITE}

    @extend_schema(operation_id="egress_rules_retrieve", tags=["egress"], responses=RuleOutput,
                   description="One egress rule.")
    def get(self, request: Request, rule_id: str) -> Response:
        return Response(RuleOutput(rule_get(operator=self.operator(request), rule_id=rule_id)).data)

    @extend_schema(operation_id="egress_rules_delete", tags=["egress"], responses={204: None},
                   description="Stop allowing the host: new connections are refused within `EGRESS_RULES_REFRESH_S`; "
                               "open tunnels are not cut.")
    def delete(self, request: Request, rule_id: str) -> Response:
        rule_delete(rule=rule_get(operator=self.operator(request), rule_id=rule_id), actor=self.actor(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DecisionPagination(BoundedCursorPagination):
    """Keyset on the id (insertion order), newest first: the log has no created_at."""

    ordering = ("-id",)


class DecisionListView(EgressView):
    scopes = {"GET": S.TENANTS_READ}
    extra_query_params = tuple(DecisionQuery().fields)

    @extend_schema(operation_id="egress_decisions_list", tags=["egress"], parameters=[DecisionQuery],
                   responses=cursor_page(DecisionOutput),
                   description="The customer's egress log, newest first (the newest `EGRESS_LOG_KEEP_PER_TENANT`): "
                               "each connection allowed or refused, its host, port, bytes and duration. Never a "
                               "path, query, header or body.")
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        self.query(request, DecisionQuery)
        paginator = DecisionPagination()
        page = paginator.paginate_queryset(decision_list(tenant=tenant), request, view=self)
        return paginator.get_paginated_response(DecisionOutput(page, many=True).data)
