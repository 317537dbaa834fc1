"""``manage.py egress_proxy --tenant <id> --listen 127.0.0.1:3128`` (or ``--listen /run/egress/<id>.sock``): one
tenant's egress proxy as a process, until SIGINT/SIGTERM. The sandbox wiring points the instance's HTTPS_PROXY and
HTTP_PROXY at the path it gives the instance to this socket."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from egress.runner import run_egress_proxy


class Command(BaseCommand):
    help = "Run one tenant's egress proxy (CONNECT + plain http, allow-listed, logged) on a TCP or unix socket."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="the tenant whose allow-list applies and log is written")
        parser.add_argument("--listen", required=True, help="host:port, or a unix socket path (absolute or unix:)")

    def handle(self, *args: Any, **options: Any) -> None:
        def ready(server: Any) -> None:
            names = [str(s.getsockname()) for s in server.sockets]
            self.stdout.write(f"egress proxy for tenant {options['tenant']} listening on {', '.join(names)}")
            self.stdout.flush()

        run_egress_proxy(tenant_id=options["tenant"], listen=options["listen"], ready=ready)
