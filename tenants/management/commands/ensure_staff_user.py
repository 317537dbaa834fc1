"""``manage.py ensure_staff_user USERNAME``: create a staff superuser once; print its password only then."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a staff superuser if missing and print its generated password (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        users = get_user_model()
        if users.objects.filter(username=username).exists():
            self.stderr.write(f"Staff user {username!r} already exists; its password was shown when created.")
            return
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser(username=username, password=password, email="")
        self.stderr.write(f"Created staff user {username!r}. Password (shown once):")
        self.stdout.write(password)
