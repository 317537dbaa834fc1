from django.apps import AppConfig


class McpServersConfig(AppConfig):
    name = "mcp_servers"
    verbose_name = "MCP servers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py is loaded before the app registry is ready. Provisioning (and the
        # instances' internal API) sits below this app and hears of it only through this registration.
        from provisioning.resources.contributions import mcp_server_source_register

        from .selectors import tenant_mcp_servers

        # An instance gets its tenant's registered servers with each task's configuration, under `mcp`.
        mcp_server_source_register("mcp_servers", tenant_mcp_servers)
