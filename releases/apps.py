from django.apps import AppConfig


class ReleasesConfig(AppConfig):
    name = "releases"
    verbose_name = "Agent releases"
    default_auto_field = "django.db.models.BigAutoField"
