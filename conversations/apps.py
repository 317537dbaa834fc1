from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = "Conversations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py is loaded before the app registry is ready (models, signals).
        from corsheaders.signals import check_request_enabled

        from instances.signals import heartbeat_received
        from provisioning.resources.contributions import activity_source_register

        from .activity import INBOX_ACTIVITY
        from .cors import allow_operator_origin
        from .tasks import inbox_on_heartbeat_received

        check_request_enabled.connect(allow_operator_origin, dispatch_uid="conversations.cors")
        # A ready instance with items waiting gets them at its heartbeat, not at the next beat.
        heartbeat_received.connect(inbox_on_heartbeat_received, dispatch_uid="conversations.inbox_on_heartbeat")
        # The inbox keeps an instance awake and wakes it (provisioning.fleet.sleep asks its registered sources).
        activity_source_register(INBOX_ACTIVITY)
