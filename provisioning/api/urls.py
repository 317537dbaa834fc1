from django.urls import path

from . import views

urlpatterns = [
    path("tenants/<str:tenant_id>/recoveries", views.TenantRecoveryListView.as_view(), name="tenant-recoveries"),
]
