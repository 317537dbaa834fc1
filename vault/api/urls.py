from django.urls import path

from . import views

urlpatterns = [
    path("tenants/<str:tenant_id>/credentials", views.CredentialListView.as_view(), name="credential-list"),
    path("tenants/<str:tenant_id>/credentials/<str:name>", views.CredentialDetailView.as_view(),
         name="credential-detail"),
]
