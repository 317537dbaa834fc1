from django.urls import path

from . import endpoint, views

T = "tenants/<str:tenant_id>"

urlpatterns = [
    path("mcp-servers", views.OperatorMcpServerListView.as_view(), name="mcp-server-list"),
    path("mcp-servers/<str:server_id>", views.OperatorMcpServerDetailView.as_view(), name="mcp-server-detail"),
    path(f"{T}/mcp-servers", views.TenantMcpServerListView.as_view(), name="tenant-mcp-server-list"),
    path(f"{T}/mcp-servers/<str:server_id>", views.TenantMcpServerDetailView.as_view(),
         name="tenant-mcp-server-detail"),
    # The customer's agent as an MCP server (streamable HTTP): customer or operator token.
    path(f"{T}/mcp", endpoint.AgentMcpEndpointView.as_view(), name="tenant-mcp-endpoint"),
]
