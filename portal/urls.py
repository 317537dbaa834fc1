"""The whole URL map of an operator host (set per request by ``portal.middleware``)."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from branding.views import asset

from . import views

# This module is a root URLconf (set per request), so the "portal" namespace is declared with include().
portal_patterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="portal:login"), name="logout"),
    path("customers/", views.onboard, name="onboard"),
    path("customers/<uuid:tenant_id>/", views.customer, name="customer"),
    path("customers/<uuid:tenant_id>/live", views.customer_live, name="customer-live"),
    path("customers/<uuid:tenant_id>/credentials/", views.credential_add, name="credential-add"),
    path("customers/<uuid:tenant_id>/credentials/<str:name>/revoke/", views.credential_revoke_view,
         name="credential-revoke"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<str:prefix>/revoke/", views.token_revoke, name="token-revoke"),
    path("branding/", views.branding, name="branding"),
    path("branding/preview", views.branding_preview, name="branding-preview"),
    path("branding/status", views.branding_status, name="branding-status"),
    path("branding/assets/<str:sha256>", asset, name="asset"),
]

urlpatterns = [path("", include((portal_patterns, "portal")))]
