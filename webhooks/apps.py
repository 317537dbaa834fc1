from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "webhooks"
    verbose_name = "Events and webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py is loaded before the app registry is ready (models, signals).
        # tenants sits below webhooks, so the audit writer announces each row and this app listens. The signal is
        # sent synchronously inside the audit's transaction (tenants/audit.py), so the event and its deliveries
        # still commit, or roll back, with the change they describe.
        from tenants.audit import audit_recorded
        from vault.wrapped_secrets import wrapped_secrets_register

        from .receivers import event_from_audit_row
        from .services import webhook_endpoint_secrets

        audit_recorded.connect(event_from_audit_row, dispatch_uid="webhooks.event_from_audit_row")
        # A KEK rotation re-wraps the endpoints' signing secrets after the data keys (they are wrapped by the KEK).
        wrapped_secrets_register(webhook_endpoint_secrets)
