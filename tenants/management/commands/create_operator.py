"""``manage.py create_operator SLUG --name NAME``: a new operator and its first API token (last line)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.errors import ApplicationError
from tenants.actors import Actor
from tenants.services import operator_create
from tenants.tokens import operator_token_issue


class Command(BaseCommand):
    help = "Create an operator and print a new API token alone on the last line (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", required=True)
        parser.add_argument("--domain", action="append", default=[], help="Portal host name (repeatable).")

    def handle(self, *args, slug: str, name: str, domain: list[str], **options):
        actor = Actor(kind="system", label="manage.py create_operator")
        try:
            operator = operator_create(slug=slug, name=name, domains=domain, actor=actor)
            issued = operator_token_issue(operator=operator, actor=actor)
        except ApplicationError as exc:
            raise CommandError(exc.detail) from None
        self.stderr.write(f"Created operator {operator.slug}. API token (shown once, store it now):")
        self.stdout.write(issued.plaintext)
