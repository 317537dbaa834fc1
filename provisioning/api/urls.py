from django.urls import path

from . import views

urlpatterns = [
    path("tenants", views.TenantListCreateView.as_view(), name="tenant-list"),
    path("tenants/<str:tenant_id>", views.TenantDetailView.as_view(), name="tenant-detail"),
    path("tenants/<str:tenant_id>/suspend", views.TenantSuspendView.as_view(), name="tenant-suspend"),
    path("tenants/<str:tenant_id>/resume", views.TenantResumeView.as_view(), name="tenant-resume"),
    path("tenants/<str:tenant_id>/restart", views.TenantRestartView.as_view(), name="tenant-restart"),
    path("tenants/<str:tenant_id>/recoveries", views.TenantRecoveryListView.as_view(), name="tenant-recoveries"),
]
