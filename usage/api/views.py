"""``/api/v1/usage`` and ``/api/v1/tenants/{id}/usage``: what the operator's customers used, per UTC day.

Thin views: the caller's operator scopes every row (another operator's customer is a 404), the token's
``tenants:read`` scope reads it, the query serializer checks the period, the selectors do the rest. JSON is a
limit/offset page; ``Accept: text/csv`` or ``?format=csv`` is the whole period in one CSV (the billing export).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.errors import ValidationFailed
from controlplane.openapi import paginated
from controlplane.pagination import BoundedLimitOffsetPagination
from tenants.api.views import ScopedView
from tenants.choices import TokenScope
from tenants.selectors import tenant_get

from ..pricing import price_book
from ..selectors import usage_period, usage_rows
from .renderers import UsageCSVRenderer
from .serializers import UsageDayOutput, UsageQuery

TAG = ["usage"]
_DESCRIBED = ("One row per customer and UTC day from `from` to `to` (both included; default: this month so far; "
              "at most 366 days): tasks submitted, done and failed, step attempts and their seconds, messages in "
              "and out, effects committed, model tokens per model (what the agent reported with `ctx.usage`), and "
              "the schema's size on disk. Collected from the instances every `USAGE_COLLECT_INTERVAL_S`; "
              "`collected_at` says when. `Accept: text/csv` or `?format=csv`: the whole period as CSV.")
_RESPONSES: dict[Any, Any] = {
    (200, "application/json"): OpenApiResponse(response=paginated(UsageDayOutput), description="one page of rows"),
    (200, "text/csv"): OpenApiResponse(response=OpenApiTypes.STR, description="every row of the period, as CSV")}


class _UsageView(ScopedView):
    scopes = {"GET": TokenScope.TENANTS_READ}
    extra_query_params = ("from", "to", "format", "limit", "offset")
    renderer_classes = [JSONRenderer, UsageCSVRenderer]
    pagination_class = BoundedLimitOffsetPagination

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # DRF answers an unknown ?format= with a bare 404; it is a bad parameter (400), said before negotiating.
        chosen = request.query_params.get("format")
        if not force and chosen is not None and chosen not in ("json", "csv"):
            raise ValidationFailed("format must be json or csv")
        return super().perform_content_negotiation(request, force)

    def rows_response(self, request: Request, rows: Any) -> Response:
        context = {"prices": price_book(self.operator(request))}  # the caller's operator's, over the defaults
        if request.accepted_renderer.format == "csv":
            return Response(UsageDayOutput(rows, many=True, context=context).data)
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(UsageDayOutput(page, many=True, context=context).data)

    def period(self, request: Request) -> tuple[Any, Any]:
        q = self.query(request, UsageQuery)
        return usage_period(q.get("from"), q.get("to"))


class UsageListView(_UsageView):
    @extend_schema(operation_id="usage_list", tags=TAG, parameters=[UsageQuery], responses=_RESPONSES,
                   description="Every customer's usage. " + _DESCRIBED)
    def get(self, request: Request) -> Response:
        start, end = self.period(request)
        return self.rows_response(request, usage_rows(operator=self.operator(request), start=start, end=end))


class TenantUsageView(_UsageView):
    @extend_schema(operation_id="tenants_usage", tags=TAG, parameters=[UsageQuery], responses=_RESPONSES,
                   description="One customer's usage. " + _DESCRIBED)
    def get(self, request: Request, tenant_id: str) -> Response:
        tenant = tenant_get(operator=self.operator(request), tenant_id=tenant_id)
        start, end = self.period(request)
        return self.rows_response(request, usage_rows(operator=self.operator(request), start=start, end=end,
                                                      tenant=tenant))
