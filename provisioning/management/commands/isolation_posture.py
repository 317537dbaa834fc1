"""``manage.py isolation_posture [--json]``: every isolation boundary with pass / degraded / fail and the fix.

Exits 1 when a boundary fails (degraded is reported, not fatal), so a deploy script can gate on it. The
``(inside)`` lines are probed from inside a real sandbox (``provisioning/fleet/posture_inside.py``): as ``nobody`` in a
fresh one by default, or with ``--tenant SLUG`` inside that tenant's own (its uid, cgroup and environment).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from rich.console import Console
from rich.table import Table

from provisioning.fleet.posture import FAIL, posture_as_data

_STYLE = {"pass": "green", "degraded": "yellow", "fail": "bold red"}


def _tenant_lines(slug: str) -> list[dict[str, Any]]:
    """The inside lines probed in ``slug``'s own sandbox, exactly as its instance runs."""
    from django.core.management.base import CommandError

    from provisioning.fleet.instances import _INSTANCE_SECRETS
    from provisioning.fleet.posture_inside import inside_posture_lines
    from provisioning.resources.spec import tenant_spec
    from tenants.models import Tenant

    tenant = Tenant.objects.exclude(status="deleted").filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"no tenant {slug!r}")
    return [x.as_dict() for x in inside_posture_lines(tenant_spec(tenant, with_secrets=_INSTANCE_SECRETS))]


class Command(BaseCommand):
    help = "Show the isolation posture: one line per boundary between an instance and everything else."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the lines as JSON")
        parser.add_argument("--tenant", help="run the inside probes in this tenant's own sandbox (its slug)")

    def handle(self, *args: Any, **options: Any) -> None:
        lines = posture_as_data()
        if options["tenant"]:
            lines = [x for x in lines if not x["boundary"].endswith("(inside)")] + _tenant_lines(options["tenant"])
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
