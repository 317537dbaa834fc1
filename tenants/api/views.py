"""The operator API's shared base views (the caller's operator, its acting identity, throttles, strict query
strings, a scope per method) and the plans list. Every app's operator endpoints derive from these; the tenant
endpoints themselves are provisioning's (``provisioning/api/views.py``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.strict import StrictQueryMixin
from controlplane.throttles import OperatorThrottle
from tenants.actors import Actor
from tenants.choices import TokenScope
from tenants.models import Plan

from .serializers import PlanOutput


class OperatorAPIView(StrictQueryMixin, GenericAPIView):
    """Base of the operator API: the caller's operator and acting identity, per-operator throttling, and
    strict query strings (an unknown parameter is a 400)."""

    throttle_classes = [OperatorThrottle]
    pagination_class: type[BasePagination] | None = None  # declared: subclasses set one (DRF is untyped here)

    def operator(self, request: Request):
        return request.user.operator

    def actor(self, request: Request) -> Actor:
        return Actor.for_token(request.auth)

    def body(self, request: Request, serializer_class: type) -> dict:
        body = serializer_class(data=request.data)
        body.is_valid(raise_exception=True)
        return dict(body.validated_data)


class ScopedView(OperatorAPIView):
    """The caller's operator and a scope per method (read by ``tenants.api.permissions.IsOperator``): the
    webhooks, releases and rollouts views."""

    scopes: dict[str, str] = {}
    default_scope: str = TokenScope.TENANTS_WRITE  # a method the view does not list: the strictest it needs
    extra_query_params: tuple[str, ...] = ()  # the base's strict query check: names a view reads

    @property
    def required_scope(self) -> str:
        method = self.request.method if self.request.method != "HEAD" else "GET"
        return self.scopes.get(method or "", self.default_scope)

    @staticmethod
    def query(request: Request, serializer: type) -> dict[str, Any]:
        parsed = serializer(query=request.query_params)
        parsed.is_valid(raise_exception=True)
        return dict(parsed.validated_data)


class PlanListView(OperatorAPIView):
    @extend_schema(operation_id="plans_list", tags=["plans"], responses=PlanOutput(many=True),
                   description="The plans a new or existing tenant can be put on, with their daily quotas "
                               "(null: no limit).")
    def get(self, request: Request) -> Response:
        plans = Plan.objects.filter(is_active=True).order_by("slug")
        return Response(PlanOutput(plans, many=True).data)
