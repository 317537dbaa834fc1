from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ProvisioningConfig(AppConfig):
    name = "provisioning"
    verbose_name = "Provisioning"

    def ready(self) -> None:
        from controlplane.periodic import periodic_jobs_sync_after_migrate

        # checks: the isolation posture joins `check --deploy`; engine and rolling declare the ``workflow-run`` and
        # ``rolling-restart`` job kinds to the job kernel.
        from provisioning import checks  # noqa: F401
        from provisioning.fleet import rolling  # noqa: F401
        from provisioning.workflows import engine  # noqa: F401

        # Beat's jobs are declared once (controlplane/periodic.py) and written after every migrate; connected
        # here, the app that runs beat's sweeps, with this sender so it runs once per migrate, not once per app.
        post_migrate.connect(periodic_jobs_sync_after_migrate, sender=self)
