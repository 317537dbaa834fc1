from django.apps import AppConfig


class BrandingConfig(AppConfig):
    name = "branding"
    verbose_name = "Branding"
    default_auto_field = "django.db.models.BigAutoField"
