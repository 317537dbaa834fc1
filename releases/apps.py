from django.apps import AppConfig


class ReleasesConfig(AppConfig):
    name = "releases"
    verbose_name = "Agent releases"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py is loaded before the app registry is ready (models, signals).
        from provisioning.resources.contributions import (
            RuntimeStartHook,
            agent_config_source_register,
            declared_connections_source_register,
            default_release_source_register,
            release_installer_register,
            release_source_register,
            runtime_start_hook_register,
        )

        from . import rollouts  # noqa: F401 - declares the ``release-rollout`` job kind to the job kernel
        from .agent_configs import tenant_agent_config_effective
        from .assignments import tenant_release_initial
        from .selectors import operator_default_release_version, tenant_release_connections, tenant_release_spec
        from .store import release_installed

        # Every spec names the tenant's release; a new customer's first start records its assignment (issue 14:
        # it starts on the operator's default) before that spec is built.
        release_source_register("releases", tenant_release_spec)
        runtime_start_hook_register(RuntimeStartHook(name="releases", before=tenant_release_initial))
        # var/releases is a cache: a machine missing an install makes it from the wheel in the object store.
        release_installer_register("releases", release_installed)
        # What an instance's task gets as ctx.config (asked over the internal API, instances.internal).
        agent_config_source_register("releases", tenant_agent_config_effective)
        # Onboarding refuses a customer that would start on no release unless the operator says so (issue 32).
        default_release_source_register("releases", operator_default_release_version)
        # Which connected accounts the instance may be handed: those its release's agents declare (issue 33).
        declared_connections_source_register("releases", tenant_release_connections)
