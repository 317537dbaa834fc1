from django.apps import AppConfig


class ConnectionsConfig(AppConfig):
    name = "connections"
    verbose_name = "Connected accounts (OAuth)"
    default_auto_field = "django.db.models.BigAutoField"
