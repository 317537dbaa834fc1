"""Does the tenant database server make a tenant role prove its password? Read from ``pg_hba_file_rules``.

A role's SCRAM verifier means nothing if ``pg_hba.conf`` lets it in with ``trust``: then anyone who can
reach the server (a tenant's process on the same machine through the socket included) logs in as any
tenant. ``auth_findings`` lists the rules that weaken authentication, each as one sentence naming the
line; ``postgres_schema`` refuses to provision while a rule a tenant role could match says ``trust``
(unless ``TENANT_DATABASE_ALLOW_INSECURE_AUTH``). ``password`` (cleartext on the wire) and ``md5`` rules
are reported as weak, not refused. ``database_posture`` gives the same facts, plus which databases PUBLIC
may still connect to, as plain data for the posture checks and the dashboard.

Not cached: reading the rules on an open connection takes about 0.5 ms (measured on PostgreSQL 15), and a
cache would keep refusing for a while after an operator fixed pg_hba.conf.

No Django in the functions that take a connection; only ``database_posture`` reads settings.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["AuthFinding", "auth_findings", "public_connect_databases", "database_posture"]

REFUSED_METHODS = {"trust"}
WEAK_METHODS = {"password": "sends the password in cleartext", "md5": "accepts MD5 password hashes"}


@dataclass(frozen=True)
class AuthFinding:
    line_number: int | None
    method: str
    refused: bool  # True: a tenant role could log in without its password
    sentence: str


def _matches_database(databases: list[str], dbname: str) -> bool:
    # "replication" only matches replication connections, which tenant roles cannot make.
    return any(d in ("all", "sameuser", "samerole", dbname) for d in databases)


def _matches_user(users: list[str], role: str | None, prefix: str) -> bool:
    for user in users:
        if user == "all" or user.startswith("/"):  # a regular expression (PostgreSQL 16) could match anything
            return True
        if role is not None and user == role:
            return True
        if role is None and prefix and user.startswith(prefix):
            return True
    return False


def _describe(rule: dict[str, Any], who: str) -> str:
    address = rule["address"] or ""
    if address and rule["netmask"]:
        prefix_len = bin(int(ipaddress.ip_address(rule["netmask"]))).count("1")
        address = f"{address}/{prefix_len}"
    text = " ".join(p for p in (rule["type"], ",".join(rule["database"] or []), ",".join(rule["user_name"] or []),
                                address, rule["auth_method"]) if p)
    over = "the unix socket" if rule["type"] == "local" else f"TCP from {address or 'any address'}"
    return f'pg_hba.conf line {rule["line_number"]} ("{text}") lets {who} in over {over}'


def auth_findings(conn: psycopg.Connection, *, dbname: str, role: str | None = None,
                  prefix: str = "") -> list[AuthFinding]:
    """The pg_hba rules a tenant role (``role``, or any role named ``prefix...``) could match on ``dbname``
    that accept it without a proof of its password (refused) or with a weak one. Reading the rules takes a
    superuser (or EXECUTE on pg_hba_file_rules); without it the server is probed with a login that must fail."""
    try:
        with conn.transaction():
            cur = conn.execute(
                "SELECT line_number, type, database, user_name, address, netmask, auth_method"
                " FROM pg_hba_file_rules WHERE error IS NULL ORDER BY line_number")
            columns = [c.name for c in cur.description or ()]
            rules = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
    except psycopg.errors.InsufficientPrivilege:
        return _probe(conn, dbname=dbname)
    who = f"role {role}" if role else "every tenant role"
    findings = []
    for rule in rules:
        method = rule["auth_method"]
        if method not in REFUSED_METHODS and method not in WEAK_METHODS:
            continue
        tenant_can_match = (_matches_database(rule["database"] or [], dbname)
                            and _matches_user(rule["user_name"] or [], role, prefix))
        if not tenant_can_match:
            continue
        described = _describe(rule, who)
        if method in REFUSED_METHODS:
            sentence = (f"{described} without any password; change its method to scram-sha-256 (or reject)"
                        " and reload the server (SELECT pg_reload_conf()).")
        else:
            sentence = f"{described} with a method that {WEAK_METHODS[method]}; prefer scram-sha-256."
        findings.append(AuthFinding(line_number=rule["line_number"], method=method,
                                    refused=method in REFUSED_METHODS, sentence=sentence))
    return findings


def _probe(conn: psycopg.Connection, *, dbname: str) -> list[AuthFinding]:
    """Without the rules (not a superuser): try a login that must fail, as a role that does not exist."""
    try:
        psycopg.connect(host=conn.info.host, port=conn.info.port, dbname=dbname, user="cp_auth_probe_nobody",
                        password="not-the-password", connect_timeout=10).close()  # noqa: S106
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc) and "role" in str(exc):
            # trust (or any method that skips the password) reaches the role lookup; password methods fail first
            return [AuthFinding(None, "trust", True, "the server got as far as looking up a role without checking"
                                " a password (pg_hba.conf trusts it); require scram-sha-256 in pg_hba.conf.")]
        return []
    return [AuthFinding(None, "trust", True, "the server let a role that does not exist in without a password;"
                        " require scram-sha-256 in pg_hba.conf.")]


def public_connect_databases(conn: psycopg.Connection, *, exclude: tuple[str, ...] = ()) -> list[str]:
    """Databases on this server (other than ``exclude``) that PUBLIC, so every tenant role, may connect to."""
    rows = conn.execute(
        "SELECT datname FROM pg_database WHERE datallowconn AND has_database_privilege('public', oid, 'CONNECT')"
        " AND NOT datname = ANY(%s) ORDER BY datname", (list(exclude),)).fetchall()
    return [row[0] for row in rows]


def _line(boundary: str, status: str, detail: str, fix: str = "") -> dict[str, str]:
    return {"boundary": boundary, "status": status, "detail": detail, "fix": fix}


def _server_posture(conninfo: dict[str, Any], *, label: str, tenant_db: bool, prefix: str) -> list[dict[str, str]]:
    dbname = str(conninfo.get("dbname", ""))
    try:
        with psycopg.connect(**conninfo, autocommit=True, connect_timeout=10,
                             application_name="controlplane-posture") as conn:
            findings = auth_findings(conn, dbname=dbname, prefix=prefix)
            public_on = public_connect_databases(conn)
    except psycopg.Error as exc:
        return [_line("database auth", "fail", f"{label}: cannot connect ({exc.__class__.__name__})",
                      "check the database URL and that the server is up")]
    refused = [f for f in findings if f.refused]
    if refused:
        auth = _line("database auth", "fail", f"{label}: " + " ".join(f.sentence for f in refused),
                     "set every pg_hba.conf rule tenant roles can match to scram-sha-256, then SELECT pg_reload_conf()")
    elif findings:
        auth = _line("database auth", "degraded", f"{label}: " + " ".join(f.sentence for f in findings),
                     "prefer scram-sha-256 in pg_hba.conf")
    else:
        auth = _line("database auth", "pass", f"{label}: every pg_hba.conf rule a tenant role can match asks for"
                     " its password")
    lines = [auth]
    if tenant_db:
        others = [d for d in public_on if d != dbname]
        if dbname in public_on:
            lines.append(_line("database connect", "fail", f"{label}: PUBLIC may connect to {dbname}, so every"
                               " role on the server may", f"REVOKE CONNECT, TEMP ON DATABASE {dbname} FROM PUBLIC"
                               " (provisioning the next tenant does it)"))
        elif others:
            lines.append(_line("database connect", "degraded", f"{label}: tenant roles may connect to other"
                               f" databases on this server: {', '.join(others)}", "REVOKE CONNECT ON DATABASE"
                               f" <each of {', '.join(others)}> FROM PUBLIC (not done for you on a configured server)"))
        else:
            lines.append(_line("database connect", "pass", f"{label}: tenant roles may connect to {dbname} only"))
    return lines


def database_posture() -> list[dict[str, str]]:
    """Posture lines ({"boundary", "status": pass|degraded|fail, "detail", "fix"}) for the tenant database's
    server, and for the control plane's if that is another one. Connects; a few milliseconds."""
    from django.conf import settings
    from django.db import connection

    from .pg_admin import admin_conninfo

    tenant = admin_conninfo()
    lines = _server_posture(tenant, label=f"tenant database {tenant.get('dbname', '')}", tenant_db=True,
                            prefix=settings.TENANT_NAME_PREFIX)
    params = connection.get_connection_params()
    own = {k: v for k, v in params.items() if k in ("dbname", "user", "password", "host", "port", "sslmode") and v}
    same_server = (str(own.get("host", "")), str(own.get("port", "5432"))) == (
        str(tenant.get("host", "")), str(tenant.get("port", "5432")))
    if not same_server:
        lines += _server_posture(own, label=f"control-plane database {own.get('dbname', '')}", tenant_db=False,
                                 prefix=settings.TENANT_NAME_PREFIX)
    return lines + _recorded_servers_posture(tenant)


def _recorded_servers_posture(checked: dict[str, Any]) -> list[dict[str, str]]:
    """The same lines for every other recorded tenant database server (``DatabaseServer``); one that does not
    answer is a failed line of its own, not a crash of the whole check."""
    # Here, not at the top: the functions that take a connection stay free of Django (module docstring).
    from django.conf import settings

    from provisioning.databases.servers import dsn_target, server_conninfo
    from provisioning.models import DatabaseServer

    lines: list[dict[str, str]] = []
    for server in DatabaseServer.objects.order_by("id"):
        info = server_conninfo(server)
        if dsn_target(info) == dsn_target(checked):
            continue  # the server TENANT_DATABASE_URL names: checked above
        label = f"tenant database server {server.name} ({info.get('dbname', '')})"
        try:
            lines += _server_posture(info, label=label, tenant_db=True, prefix=settings.TENANT_NAME_PREFIX)
        except Exception as exc:  # noqa: BLE001 - reported, with the class only (its text may name the DSN)
            lines.append(_line("database auth", "fail", f"{label}: could not read its rules ({type(exc).__name__})",
                               f"make database server {server.name} reachable, or drain it and move its tenants"))
    return lines
