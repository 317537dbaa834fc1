"""``manage.py database_servers list|add|drain|activate|check|failover``: the tenant database servers, for staff.

``add`` records a server (its DSN without a password: put that in a libpq passfile); new tenants go to the
least-loaded active server from then on. ``drain`` stops placing new tenants on one (its tenants stay).
``check`` connects to each as the control plane would and prints its version, tenants and whether it answers.
``failover`` promotes a server's standby and restarts its instances there (``provisioning.databases.failover``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.console import Console
from rich.table import Table

from controlplane.errors import ApplicationError
from provisioning.databases.failover import database_server_failover
from provisioning.databases.move import database_move_start, wait_for_move
from provisioning.databases.servers import (
    database_server_activate,
    database_server_add,
    database_server_drain,
    database_server_update,
    database_servers_load,
    dsn_target,
    server_conninfo,
    settings_server_ensure,
)
from provisioning.models import DatabaseServer
from tenants.actors import Actor
from tenants.models import Tenant


class Command(BaseCommand):
    help = "List, add, drain, activate or check the servers that hold tenant schemas."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every server with its state, tenants and capacity")
        add = sub.add_parser("add", help="record a server (new tenants may be placed on it at once)")
        add.add_argument("name")
        add.add_argument("dsn", help="libpq DSN or URL without a password (passfile=... or PGPASSFILE)")
        add.add_argument("--capacity", type=int, default=1000)
        add.add_argument("--pooler", default="", help="DSN of a PgBouncer in transaction mode in front of it")
        add.add_argument("--standby", default="", help="DSN of its streaming standby")
        for verb in ("drain", "activate"):
            sub.add_parser(verb).add_argument("name")
        sub.add_parser("check", help="connect to each server and report")
        change = sub.add_parser("set", help="change a server's capacity, pooler or standby (\"\" removes one)")
        change.add_argument("name")
        change.add_argument("--capacity", type=int)
        change.add_argument("--pooler", help="DSN of a PgBouncer in transaction mode (instances use it at next start)")
        change.add_argument("--standby", help="DSN of its streaming standby")
        failover = sub.add_parser("failover", help="promote the server's standby, repoint it, restart its instances")
        failover.add_argument("name")
        failover.add_argument("--force", action="store_true",
                              help="even though the primary still answers (only once it is fenced)")
        move = sub.add_parser("move", help="move one tenant's schema to another server (a resumable workflow)")
        move.add_argument("tenant", help="the tenant's id")
        move.add_argument("--to", required=True, dest="target", help="the server to move it to")
        move.add_argument("--wait", action="store_true", help="wait for the move and print its steps")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        actor = Actor(kind="system", label=f"manage.py database_servers {action}")
        try:
            if action == "add":
                server = database_server_add(name=options["name"], dsn=options["dsn"], actor=actor,
                                             capacity=options["capacity"], pooler_dsn=options["pooler"],
                                             standby_dsn=options["standby"])
                self.stdout.write(f"database server {server.name} added (active, capacity {server.capacity})")
            elif action == "set":
                server = database_server_update(name=options["name"], actor=actor, capacity=options["capacity"],
                                                pooler_dsn=options["pooler"], standby_dsn=options["standby"])
                pooler, standby = ("yes" if v else "no" for v in (server.pooler_dsn, server.standby_dsn))
                self.stdout.write(f"database server {server.name}: capacity {server.capacity}, pooler {pooler},"
                                  f" standby {standby}")
            elif action == "drain":
                self.stdout.write(f"database server {database_server_drain(name=options['name'], actor=actor)}"
                                  " draining: no new tenants")
            elif action == "move":
                self._move(options["tenant"], options["target"], actor, wait=options["wait"])
            elif action == "failover":
                self._failover(options["name"], force=options["force"], actor=actor)
            elif action == "activate":
                self.stdout.write(f"database server {database_server_activate(name=options['name'], actor=actor)}"
                                  " active")
            else:
                settings_server_ensure()
                self._table(check=action == "check")
        except ApplicationError as exc:
            raise CommandError(exc.detail) from None

    def _move(self, tenant_id: str, target: str, actor: Actor, *, wait: bool) -> None:
        try:
            tenant = Tenant.objects.get(pk=tenant_id)
        except (Tenant.DoesNotExist, ValidationError):
            raise CommandError(f"no tenant with id {tenant_id!r}") from None
        move = database_move_start(tenant=tenant, target=target, actor=actor)
        self.stdout.write(f"moving {tenant.slug} from {move.source} to {move.target} (workflow {move.run_id})")
        if not wait:
            return
        run = wait_for_move(move)
        for step in run.steps.order_by("position"):
            self.stdout.write(f"  {step.name:<12} {step.status}  {step.output or step.error}")
        if run.status != "succeeded":
            raise CommandError(f"the move did not finish: {run.status} {run.error}")
        self.stdout.write(f"{tenant.slug} is on {move.target}")

    def _failover(self, name: str, *, force: bool, actor: Actor) -> None:
        done = database_server_failover(name=name, actor=actor, force=force)
        how = "standby promoted" if done.promoted else "standby was already promoted"
        self.stdout.write(f"database server {name} failed over to {done.primary} ({how}) in {done.seconds} s: "
                          f"{len(done.restarted)} instance(s) restarted, {len(done.already_on_new_primary)} already "
                          f"there, {len(done.skipped)} left alone")
        for slug, why in sorted(done.failed.items()):
            self.stderr.write(f"  {slug}: not restarted: {why}")
        if done.failed:
            raise CommandError(f"{len(done.failed)} instance(s) did not restart: run the failover again")

    def _table(self, *, check: bool) -> None:
        table = Table("name", "database", "state", "tenants", "capacity", "pooler", "auth",
                      *(["answers"] if check else []))
        for server in database_servers_load():
            row = [server.name, "/".join(dsn_target(psycopg.conninfo.conninfo_to_dict(server.dsn))), server.state,
                   str(server.tenants), str(server.capacity), "yes" if server.pooler_dsn else "", server.auth or ""]
            if check:
                row.append(_answer(server))
            table.add_row(*row)
        Console(file=self.stdout, width=140).print(table)


def _answer(server: DatabaseServer) -> str:
    """The server's version, or why it did not answer (the class of the error: its text may hold the DSN)."""
    try:
        with psycopg.connect(**server_conninfo(server), connect_timeout=5, autocommit=True) as conn:
            return f"PostgreSQL {conn.info.server_version // 10000}"
    except psycopg.Error as exc:
        return f"no: {type(exc).__name__}"
