from django.urls import path

from . import views

urlpatterns = [
    path("tenants", views.TenantListCreateView.as_view(), name="tenant-list"),
    path("tenants/<str:tenant_id>", views.TenantDetailView.as_view(), name="tenant-detail"),
]
