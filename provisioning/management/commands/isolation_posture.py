"""``manage.py isolation_posture [--json]``: every isolation boundary with pass / degraded / fail and the fix.

Exits 1 when a boundary fails (degraded is reported, not fatal), so a deploy script can gate on it.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from rich.console import Console
from rich.table import Table

from provisioning.posture import FAIL, posture_as_data

_STYLE = {"pass": "green", "degraded": "yellow", "fail": "bold red"}


class Command(BaseCommand):
    help = "Show the isolation posture: one line per boundary between an instance and everything else."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the lines as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        lines = posture_as_data()
        if options["json"]:
            self.stdout.write(json.dumps(lines, indent=2))
        else:
            table = Table(title="Isolation posture")
            for column in ("boundary", "status", "detail", "fix"):
                table.add_column(column, overflow="fold")
            for line in lines:
                table.add_row(line["boundary"], f"[{_STYLE[line['status']]}]{line['status']}[/]", line["detail"],
                              line["fix"])
            Console(file=self.stdout, width=160).print(table)
        if any(line["status"] == FAIL for line in lines):
            raise SystemExit(1)
