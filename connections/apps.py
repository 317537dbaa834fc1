from django.apps import AppConfig


class ConnectionsConfig(AppConfig):
    name = "connections"
    verbose_name = "Connected accounts (OAuth)"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py is loaded before the app registry is ready. Provisioning (and the
        # instances' internal API) sits below this app and hears of it only through this registration.
        from provisioning.resources.contributions import (
            ConnectionDelivery,
            connection_delivery_register,
            deprovision_hook_register,
        )
        from vault.wrapped_secrets import wrapped_secrets_register

        from .services import (
            connection_deliver_answer,
            connection_deliverable,
            connections_disconnect_all,
            oauth_client_secrets,
        )

        connection_delivery_register(ConnectionDelivery(name="connections", deliver=connection_deliver_answer,
                                                        deliverable=connection_deliverable))
        # Deprovisioning a customer disconnects its accounts: revoked at the providers, tokens deleted.
        deprovision_hook_register("connections", connections_disconnect_all)
        # A KEK rotation re-wraps the operators' client secrets after the data keys (they are wrapped by the KEK).
        wrapped_secrets_register(oauth_client_secrets)
