"""``manage.py settings``: every environment variable the control plane reads, from ``controlplane.config_table``.

The default output is a table (name, type, default, production rule, meaning); ``--markdown`` prints the README's
configuration section, which ``tests/controlplane/test_settings_table.py`` compares with the README. Values are never
printed: the table says what may be set, not what is (secrets stay out of terminals and logs).
"""

from __future__ import annotations

import io

from django.core.management.base import BaseCommand
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from controlplane.config_table import SETTINGS, Production, markdown_table


class Command(BaseCommand):
    help = ("List every environment variable the control plane reads: name, type, default, whether production may "
            "set it, meaning (declared once in controlplane/config_table.py). --markdown: the README's section.")

    def add_arguments(self, parser):
        parser.add_argument("--markdown", action="store_true",
                            help="print the README's configuration tables (Markdown) instead")
        parser.add_argument("--width", type=int, default=160, help="table width in columns (default 160)")

    def handle(self, *args, markdown: bool, width: int, **options):
        if markdown:
            self.stdout.write(markdown_table(), ending="")
            return
        table = Table(title="Control-plane settings (environment variables)", expand=True)
        table.add_column("variable", no_wrap=True, min_width=max(len(name) for name in SETTINGS))
        table.add_column("type", no_wrap=True, min_width=max(len(s.type) for s in SETTINGS.values()))
        table.add_column("default", overflow="fold", ratio=1)
        table.add_column("production", no_wrap=True, min_width=max(len(p.value) for p in Production))
        table.add_column("meaning", overflow="fold", ratio=2)
        section = ""
        for setting in SETTINGS.values():
            if setting.section != section:
                section = setting.section
                table.add_section()
                table.add_row(f"[bold]{section}[/bold]", "", "", "", "")
            table.add_row(*(escape(cell) for cell in (setting.name, setting.type, setting.shown_default,
                                                      setting.production.value, setting.doc)))
        buffer = io.StringIO()
        Console(file=buffer, width=width, no_color=True, highlight=False, soft_wrap=False).print(table)
        self.stdout.write(buffer.getvalue(), ending="")
