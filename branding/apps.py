from django.apps import AppConfig


class BrandingConfig(AppConfig):
    name = "branding"
    verbose_name = "Branding"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: apps.py is loaded before the app registry is ready (models, signals).
        from provisioning.resources.contributions import (
            RuntimeStartHook,
            runtime_start_hook_register,
            theme_source_register,
        )

        from .selectors import current_theme_document
        from .services import tenant_branding_publish

        # The Kubernetes runtime mounts the operator's current theme; a new instance is branded from the start
        # (issue 7), once onboarding has started it.
        theme_source_register("branding", current_theme_document)
        runtime_start_hook_register(RuntimeStartHook(name="branding", after=tenant_branding_publish))
