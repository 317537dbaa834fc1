from django.apps import AppConfig


class VaultConfig(AppConfig):
    name = "vault"
    verbose_name = "Credential vault"

    def ready(self) -> None:
        # Declares the ``vault-rotation`` job kind to the job kernel, so its drive task and sweep know it.
        from . import rotation  # noqa: F401
