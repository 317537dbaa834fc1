from django.urls import path

from . import views

urlpatterns = [
    path("usage", views.UsageListView.as_view(), name="usage"),
    path("tenants/<str:tenant_id>/usage", views.TenantUsageView.as_view(), name="tenant-usage"),
]
