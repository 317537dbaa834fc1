"""``manage.py egress_proxy --listen 127.0.0.1:3128``: the machine's egress proxy, every tenant identified by its
proxy credential (what ``LOCAL_INSTANCE_NETWORK=isolated`` wires each instance to, at ``EGRESS_PROXY_ADDRESS``;
``make run`` supervises it). With ``--tenant <id>`` (and ``--listen`` a TCP address or a unix socket path): one
tenant's proxy, no credential asked. Runs until SIGINT/SIGTERM."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from egress.runner import run_egress_proxy


class Command(BaseCommand):
    help = ("Run the egress proxy (CONNECT + plain http, allow-listed, logged) for every tenant by its proxy "
            "credential, or for one --tenant, on a TCP or unix socket.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", default=None,
                            help="serve this tenant only, without credentials (default: every tenant, each request "
                                 "authenticated as tenant id : instance token)")
        parser.add_argument("--listen", default=None,
                            help="host:port, or a unix socket path (absolute or unix:); default EGRESS_PROXY_ADDRESS")

    def handle(self, *args: Any, **options: Any) -> None:
        def ready(server: Any) -> None:
            names = [str(s.getsockname()) for s in server.sockets]
            whose = f"tenant {options['tenant']}" if options["tenant"] else "every tenant (proxy authentication)"
            self.stdout.write(f"egress proxy for {whose} listening on {', '.join(names)}")
            self.stdout.flush()

        listen = options["listen"] or settings.EGRESS_PROXY_ADDRESS
        if not listen:
            raise CommandError("--listen, or EGRESS_PROXY_ADDRESS, says where to listen")
        run_egress_proxy(tenant_id=options["tenant"], listen=listen, ready=ready)
