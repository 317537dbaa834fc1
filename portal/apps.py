from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    verbose_name = "Operator portal"
    default_auto_field = "django.db.models.BigAutoField"
