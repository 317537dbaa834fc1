"""The tenant list's query parameters (``GET /api/v1/tenants``) as a django-filter FilterSet (what DRF documents, as
NetBox does)."""

from __future__ import annotations

import datetime as dt

import django_filters
from django import forms
from django.db.models import Q, QuerySet
from django_filters.fields import IsoDateTimeField

from tenants.choices import TenantStatus
from tenants.models import Tenant

__all__ = ["TenantFilterSet"]


class _GivenIsoDateTimeField(IsoDateTimeField):
    """A parameter that is present must be a date-time: ``created_before=`` is a 400, not "no filter" (an empty
    string is not the date-time the schema promises; leaving the parameter out means no filter)."""

    def clean(self, value: str | None) -> dt.datetime | None:
        if value == "":
            raise forms.ValidationError("an empty value is not an ISO 8601 date-time: leave the parameter out")
        return super().clean(value)


class UTCDateTimeFilter(django_filters.IsoDateTimeFilter):
    """ISO 8601 with any offset Python accepts (up to ±23:59), compared in UTC: PostgreSQL refuses offsets past
    ±15:59 (a 500 schemathesis found with ``-16:49``)."""

    field_class = _GivenIsoDateTimeField

    def filter(self, qs: QuerySet[Tenant], value: dt.datetime | None) -> QuerySet[Tenant]:
        return super().filter(qs, value.astimezone(dt.UTC) if value is not None else value)


class TenantFilterSet(django_filters.FilterSet):
    slug = django_filters.CharFilter(field_name="slug", help_text="Exactly this slug (at most one live tenant).")
    status = django_filters.MultipleChoiceFilter(choices=TenantStatus.choices,
                                                 help_text="One or more statuses (repeat the parameter).")
    plan = django_filters.CharFilter(field_name="plan_id", help_text="The plan's slug.")
    created_after = UTCDateTimeFilter(field_name="created_at", lookup_expr="gte",
                                                     help_text="Created at or after (ISO 8601).")
    created_before = UTCDateTimeFilter(field_name="created_at", lookup_expr="lt",
                                                      help_text="Created before (ISO 8601).")
    search = django_filters.CharFilter(method="filter_search", max_length=100,
                                       help_text="Part of the slug or name, case-insensitive.")

    class Meta:
        model = Tenant
        fields: list[str] = []

    def filter_search(self, queryset: QuerySet[Tenant], name: str, value: str) -> QuerySet[Tenant]:
        return queryset.filter(Q(slug__icontains=value) | Q(name__icontains=value)) if value else queryset
