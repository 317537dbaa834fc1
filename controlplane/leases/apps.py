from django.apps import AppConfig


class LeasesConfig(AppConfig):
    name = "controlplane.leases"
    label = "leases"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Leader leases"
