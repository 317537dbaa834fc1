"""``manage.py ensure_portal_user OPERATOR USERNAME [--domain HOST]``: a first way into an operator's portal.

Adds the portal host name(s) and a portal admin once; prints the generated password alone on the last
line only when the user is created (like ``ensure_staff_user``), so scripts can keep it.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.errors import ApplicationError
from portal.bootstrap import portal_admin_ensure, portal_domain_ensure
from tenants.actors import Actor
from tenants.models import Operator


class Command(BaseCommand):
    help = "Give an operator a portal host name and a portal admin; print the admin's password if created."

    def add_arguments(self, parser):
        parser.add_argument("operator", help="The operator's slug.")
        parser.add_argument("username")
        parser.add_argument("--domain", action="append", default=[], help="Portal host name (repeatable).")

    def handle(self, *args, operator: str, username: str, domain: list[str], **options):
        actor = Actor(kind="system", label="manage.py ensure_portal_user")
        found = Operator.objects.filter(slug=operator).first()
        if found is None:
            raise CommandError(f"no operator {operator!r} (create it with manage.py create_operator)")
        try:
            for host in domain:
                if portal_domain_ensure(operator=found, domain=host, actor=actor):
                    self.stderr.write(f"Portal host {host} added to operator {found.slug}.")
            admin = portal_admin_ensure(operator=found, username=username, actor=actor)
        except ApplicationError as exc:
            raise CommandError(exc.detail) from None
        if admin.password is None:
            self.stderr.write(f"Portal user {username!r} already exists; its password was shown when created.")
            return
        self.stderr.write(f"Created portal admin {username!r} of {found.slug}. Password (shown once):")
        self.stdout.write(admin.password)
