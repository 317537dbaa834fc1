from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"

    def ready(self) -> None:
        from controlplane.periodic import periodic_jobs_sync_after_migrate

        from . import checks  # noqa: F401 - registers the isolation posture with `check --deploy`

        # Beat's jobs are declared once (controlplane/periodic.py) and written after every migrate; connected
        # here, the app that runs beat's sweeps, with this sender so it runs once per migrate, not once per app.
        post_migrate.connect(periodic_jobs_sync_after_migrate, sender=self)
