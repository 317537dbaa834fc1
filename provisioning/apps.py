from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the isolation posture with `check --deploy`
