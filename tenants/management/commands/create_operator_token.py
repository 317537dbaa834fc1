"""``manage.py create_operator_token SLUG``: issue another API token for an operator (shown once)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.errors import ApplicationError
from tenants.actors import Actor
from tenants.choices import ALL_TOKEN_SCOPES
from tenants.models import Operator
from tenants.tokens import operator_token_issue


class Command(BaseCommand):
    help = "Issue a new API token for an operator; printed alone on the last line (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name", default="default")
        parser.add_argument("--scope", action="append", choices=ALL_TOKEN_SCOPES,
                            help="Limit the token to these scopes (repeatable). Default: all.")

    def handle(self, *args, slug: str, name: str, scope: list[str] | None, **options):
        operator = Operator.objects.filter(slug=slug).first()
        if operator is None:
            raise CommandError(f"no operator with slug {slug!r}")
        try:
            issued = operator_token_issue(
                operator=operator, name=name, scopes=scope,
                actor=Actor(kind="system", label="manage.py create_operator_token"),
            )
        except ApplicationError as exc:
            raise CommandError(exc.detail) from None
        self.stderr.write(f"New API token for {operator.slug} (shown once):")
        self.stdout.write(issued.plaintext)
