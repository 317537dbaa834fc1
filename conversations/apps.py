from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = "Conversations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from corsheaders.signals import check_request_enabled

        from provisioning.contributions import activity_source_register

        from .activity import INBOX_ACTIVITY
        from .cors import allow_operator_origin

        check_request_enabled.connect(allow_operator_origin, dispatch_uid="conversations.cors")
        # The inbox keeps an instance awake and wakes it (provisioning.sleep asks its registered sources).
        activity_source_register(INBOX_ACTIVITY)
