"""URL map: admin, API v1, OpenAPI schema and Swagger UI.

Every app is wired by its dotted ``urls`` module in ``include()``: this module imports no app (controlplane is
the lowest layer of the import-linter layers).
"""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from .health import healthz, readyz
from .problem_types import problem_page

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("tenants.api.urls")),
    path("api/v1/", include("provisioning.api.urls")),
    path("", include("provisioning.urls")),  # /metrics
    path("api/v1/", include("vault.api.urls")),
    path("api/v1/", include("conversations.api.urls")),
    path("api/v1/", include("webhooks.api.urls")),
    path("api/v1/", include("usage.api.urls")),
    path("api/v1/", include("releases.api.urls")),
    path("api/v1/", include("connections.api.urls")),
    path("oauth/", include("connections.urls")),  # the provider's redirect back (connections.views)
    path("api/v1/", include("schedules.api.urls")),
    path("api/v1/", include("mcp_servers.api.urls")),
    path("api/v1/", include("egress.api.urls")),
    path("internal/v1/", include("instances.internal.urls")),
    path("internal/v1/", include("schedules.api.internal_urls")),  # ctx.schedule
    path("api/schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]),
         name="schema"),
    # The split view serves its init script from a URL (?script), so the CSP needs no inline scripts.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema", authentication_classes=[],
                                                      permission_classes=[]), name="swagger-ui"),
    path("healthz", healthz),
    path("readyz", readyz),
    path("problems/", problem_page, name="problem-types"),
    path("problems/<slug:slug>", problem_page, name="problem-type"),
    # Staff dashboard and logo assets; operator portal hosts get portal.urls instead (portal.middleware).
    path("dashboard/", include("dashboard.urls")),
    path("branding/", include("branding.urls")),
]

# API clients get problem+json even for an unexpected error (the DRF handler covers the expected ones).
handler500 = "controlplane.problems.server_error"
handler404 = "controlplane.problems.page_not_found"
