from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    name = "conversations"
    verbose_name = "Conversations"
    default_auto_field = "django.db.models.BigAutoField"
