from django.apps import AppConfig
from django.db.models.signals import post_migrate


def ensure_default_plans(sender, using: str = "default", **kwargs) -> None:
    """The default plans exist after every migrate (and after a flush, which emits post_migrate too): a
    tenant's plan is a foreign key, and onboarding refuses a plan that is not a record."""
    from .choices import DEFAULT_PLANS
    from .models import Plan

    for slug, (name, description) in DEFAULT_PLANS.items():
        Plan.objects.using(using).get_or_create(slug=slug, defaults={"name": name, "description": description})


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Operators and tenants"

    def ready(self) -> None:
        post_migrate.connect(ensure_default_plans, sender=self)
