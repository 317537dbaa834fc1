from django.urls import path

from . import views

urlpatterns = [
    path("oauth-clients", views.OAuthClientListCreateView.as_view(), name="oauth-client-list"),
    path("oauth-clients/<str:client_id>", views.OAuthClientDetailView.as_view(), name="oauth-client-detail"),
    path("tenants/<str:tenant_id>/connections", views.ConnectionListStartView.as_view(), name="connection-list"),
    path("tenants/<str:tenant_id>/connections/complete", views.ConnectionCompleteView.as_view(),
         name="connection-complete"),
    path("tenants/<str:tenant_id>/connections/<str:connection_id>", views.ConnectionDetailView.as_view(),
         name="connection-detail"),
]
