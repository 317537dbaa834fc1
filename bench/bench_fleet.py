"""Fleet benchmark (issue 16): live instances on ONE PostgreSQL with ``max_connections = 100``, through PgBouncer in
transaction mode, against the anchor of the same server without it.

The run starts its own PostgreSQL 15 (SCRAM on every line, ``max_connections = 100``) and a PgBouncer in front
(``auth_type = scram-sha-256``, ``auth_query`` through an auth user and the SECURITY DEFINER lookup of
tests/pgbouncer.py, one pool per tenant role of ``default_pool_size``, all of them capped together by
``max_db_connections``; PgBouncer closes another pool's idle server connection when a pool needs one and the cap
is reached). It makes N tenants the way provisioning does (a LOGIN role with a SCRAM verifier, its own schema,
search_path pinned, CONNECT granted, PUBLIC's revoked) and starts N ``agent-host`` processes directly with the
environment the local driver gives an instance (``python -m agent_runtime.host``, ``AGENT_DATABASE_POOLED=1``;
not through the control plane: its Celery workflow would measure onboarding, not the fleet). Each instance
heartbeats to a sink in this process (which counts them, as the control plane's endpoint would receive them),
renews its lease every heartbeat, polls for tasks, and gets a small two-step task every ``--task-every`` seconds.

Printed: live instances (process up, a heartbeat within 3 intervals, its lease unexpired), server sessions (max
seen over the window), per-instance RSS and PSS (p50), heartbeats/s received, transactions/s through PgBouncer,
tasks done; then the anchor: the same server, direct connections (two sessions per host), hosts started one at a
time until one is refused.

``python bench/bench_fleet.py`` (200 instances), ``--instances 400``, ``--window 60``; develop with ``-n 20``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent_runtime.state import tasks as task_store  # noqa: E402
from bench import _pg, _run  # noqa: E402
from tests.pgbouncer import Bouncer, install_auth_query, start_pgbouncer  # noqa: E402

PG_BIN = _pg.PG_BIN
DB = "tenantdb"
AUTH_USER = "pgbouncer_auth"
HEARTBEAT_TIMEOUT_S = 10.0  # controlplane/settings.py's default


class Postgres:
    """A private PostgreSQL 15: SCRAM everywhere, max_connections = 100, removed at the end."""

    def __init__(self, max_connections: int) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="cp-bench-fleet-pg-"))
        self.password = secrets.token_urlsafe(18)
        pwfile = self.base / "pw"
        pwfile.write_text(self.password + "\n")
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
            shutil.chown(pwfile, "postgres", "postgres")
        subprocess.run([PG_BIN / "initdb", "-D", self.base / "data", "-U", "postgres", "--auth=scram-sha-256",
                        f"--pwfile={pwfile}"], check=True, capture_output=True, **_pg.as_postgres())
        self.port = _pg.free_port()
        subprocess.run([PG_BIN / "pg_ctl", "-D", self.base / "data", "-w", "-l", self.base / "log", "-o",
                        f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.base} "
                        f"-c max_connections={max_connections} -c shared_buffers=128MB", "start"],
                       check=True, capture_output=True, **_pg.as_postgres())
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))

    def url(self, dbname: str = DB) -> str:
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user="postgres",
                                              password=self.password)

    def stop(self) -> None:
        subprocess.run([PG_BIN / "pg_ctl", "-D", self.base / "data", "-w", "-m", "immediate", "stop"],
                       capture_output=True, **_pg.as_postgres())
        shutil.rmtree(self.base, ignore_errors=True)


class HeartbeatSink:
    """Stands for the control plane's heartbeat endpoint: counts each instance's heartbeats and their times. It
    also answers the agent configuration each task asks for when it starts, as the control plane does for a
    customer with none (``{"config": {}}``): without an answer a task waits for it and never runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: dict[str, float] = {}
        self.total = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            # Connections kept alive between beats, as the web tier keeps them (gunicorn's keepalive, 5 s, is longer
            # than the 2 s beat: deploy/gunicorn.conf.py).
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                token = (self.headers.get("Authorization") or "")[len("Bearer "):]
                with sink.lock:
                    sink.last[token] = time.monotonic()
                    sink.total += 1
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                if self.path != "/internal/v1/agent-config":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = b'{"config": {}}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 256
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


def make_tenants(pg: Postgres, n: int, start: int = 0) -> list[dict[str, str]]:
    """N tenants as provisioning makes them (``provisioning/drivers/local_postgres``'s statements, in short)."""
    tenants = []
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(sql.Identifier(DB)))
        for i in range(start, start + n):
            name, password = f"fleet_{i:04d}", secrets.token_urlsafe(18)
            ident = sql.Identifier(name)
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(ident, sql.Literal(password)))
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(DB), ident))
            conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(ident, ident))
            conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(ident))
            conn.execute(sql.SQL("ALTER ROLE {} SET search_path TO {}").format(ident, ident))
            tenants.append({"name": name, "password": password, "token": secrets.token_hex(8)})
    return tenants


def host_env(tenant: dict[str, str], dsn: str, pooled: bool, base: Path, sink: HeartbeatSink,
             args: argparse.Namespace) -> dict[str, str]:
    volume = base / tenant["name"] / "volume"
    objects = base / tenant["name"] / "objects"
    volume.mkdir(parents=True, exist_ok=True, mode=0o700)
    objects.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
        "AGENT_TENANT_ID": str(__import__("uuid").uuid4()), "AGENT_SCHEMA": tenant["name"],
        "AGENT_DATABASE_URL": dsn, "AGENT_DATABASE_POOLED": "1" if pooled else "0",
        "AGENT_VOLUME": str(volume), "AGENT_OBJECTSTORE_URL": f"file://{objects}/",
        "AGENT_OBJECT_KEY": base64.b64encode(os.urandom(32)).decode(), "AGENT_APP": "bench.fleet_agent:AGENTS",
        "AGENT_CONTROL_PLANE_URL": sink.url, "AGENT_INSTANCE_TOKEN": tenant["token"],
        "AGENT_HEARTBEAT_INTERVAL_S": str(args.heartbeat_s), "AGENT_POLL_INTERVAL_S": str(args.poll_s),
    }


class Fleet:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.envs: dict[str, dict[str, str]] = {}

    def start(self, name: str, env: dict[str, str]) -> None:
        log = (self.base / name / "host.log").open("ab")
        self.procs[name] = subprocess.Popen([sys.executable, "-m", "agent_runtime.host"], env=env, cwd=ROOT,
                                            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.envs[name] = env

    def ready(self, name: str) -> bool | None:
        """True: /readyz 200; None: still booting; False: the process exited."""
        if self.procs[name].poll() is not None:
            return False
        port_file = Path(self.envs[name]["AGENT_VOLUME"], ".host", "http-port")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port_file.read_text()}/readyz", timeout=2) as resp:
                return resp.status == 200
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def wait_ready(self, names: list[str], timeout: float) -> dict[str, bool]:
        deadline = time.monotonic() + timeout
        state: dict[str, bool | None] = dict.fromkeys(names)
        while time.monotonic() < deadline and any(v is None for v in state.values()):
            for name in [n for n, v in state.items() if v is None]:
                state[name] = self.ready(name)
            time.sleep(0.2)
        return {n: bool(v) for n, v in state.items()}

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 30
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs.clear()


def server_sessions(pg: Postgres) -> tuple[int, int]:
    """(sessions of tenant roles, all client backends) on the server now."""
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE usename LIKE 'fleet\\_%%'), count(*) FROM"
                           " pg_stat_activity WHERE backend_type = 'client backend'").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def leases_alive(pg: Postgres, names: list[str]) -> set[str]:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        alive = set()
        for i in range(0, len(names), 100):
            union = sql.SQL(" UNION ALL ").join(
                sql.SQL("SELECT {} FROM {}.host_lease WHERE expires_at > clock_timestamp()").format(
                    sql.Literal(n), sql.Identifier(n)) for n in names[i:i + 100])
            alive |= {r[0] for r in conn.execute(union).fetchall()}
    return alive


def tasks_done(pg: Postgres, names: list[str]) -> int:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        total = 0
        for i in range(0, len(names), 100):
            union = sql.SQL(" UNION ALL ").join(
                sql.SQL("SELECT count(*) AS n FROM {}.tasks WHERE status = 'done'").format(sql.Identifier(n))
                for n in names[i:i + 100])
            row = conn.execute(sql.SQL("SELECT coalesce(sum(n), 0) FROM ({}) t").format(union)).fetchone()
            total += int(row[0]) if row else 0
    return total


def memory(fleet: Fleet) -> tuple[list[float], list[float]]:
    rss, pss = [], []
    for proc in fleet.procs.values():
        with contextlib.suppress(psutil.Error):
            info = psutil.Process(proc.pid).memory_full_info()
            rss.append(info.rss / 2**20)
            pss.append(info.pss / 2**20)
    return rss, pss


def xacts(bouncer: Bouncer) -> int:
    return sum(int(r["total_xact_count"]) for r in bouncer.admin("SHOW STATS") if r["database"] == DB)


def boot(fleet: Fleet, tenants: list[dict[str, str]], env_for: Any, batch: int, timeout: float,
         stop_on_refusal: bool = False) -> tuple[list[str], float]:
    """Start hosts in batches (boots are CPU-bound: two cores); return the names that became ready."""
    ready: list[str] = []
    t0 = time.perf_counter()
    for i in range(0, len(tenants), batch):
        group = tenants[i:i + batch]
        for tenant in group:
            fleet.start(tenant["name"], env_for(tenant))
        result = fleet.wait_ready([t["name"] for t in group], timeout)
        ready += [n for n, ok in result.items() if ok]
        print(f"  {len(ready)}/{i + len(group)} ready ({time.perf_counter() - t0:.0f} s)", flush=True)
        if stop_on_refusal and not all(result.values()):
            break
    return ready, time.perf_counter() - t0


def pooled_run(pg: Postgres, tenants: list[dict[str, str]], args: argparse.Namespace, base: Path) -> dict[str, Any]:
    install_auth_query(pg.url(), auth_user=AUTH_USER, auth_password=(auth_pw := secrets.token_urlsafe(18)))
    n = len(tenants)
    bouncer = start_pgbouncer(server_host="127.0.0.1", server_port=pg.port, databases=[DB], name="fleet",
                              auth_user=(AUTH_USER, auth_pw), settings={
                                  "default_pool_size": args.pool_size, "max_db_connections": args.max_db_connections,
                                  "max_client_conn": 4 * n + 100, "server_idle_timeout": 30,
                                  "query_wait_timeout": 60})
    sink = HeartbeatSink()
    fleet = Fleet(base)
    try:
        def env_for(t: dict[str, str]) -> dict[str, str]:
            return host_env(t, bouncer.dsn(DB, t["name"], t["password"]), True, base, sink, args)

        print(f"pooled: starting {n} hosts through PgBouncer (pool {args.pool_size} per tenant role,"
              f" max_db_connections {args.max_db_connections})", flush=True)
        ready, boot_s = boot(fleet, tenants, env_for, args.batch, timeout=120)
        names = [t["name"] for t in tenants]
        by_name = {t["name"]: t for t in tenants}
        max_sessions, max_backends, stop = 0, 0, threading.Event()

        def sample() -> None:
            nonlocal max_sessions, max_backends
            while not stop.is_set():
                s, b = server_sessions(pg)
                max_sessions, max_backends = max(max_sessions, s), max(max_backends, b)
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        done_before, xact_before, hb_before = tasks_done(pg, names), xacts(bouncer), sink.total
        def live_now() -> tuple[set[str], dict[str, int]]:
            """Live: process up, lease unexpired, a heartbeat within the control plane's default
            HEARTBEAT_TIMEOUT_S (10 s: older, the sweep would declare it dead and recover it)."""
            now = time.monotonic()
            with sink.lock:
                fresh = {n for n in names if now - sink.last.get(by_name[n]["token"], -1e9) < HEARTBEAT_TIMEOUT_S}
            procs = {n for n, p in fleet.procs.items() if p.poll() is None}
            leases = leases_alive(pg, names)
            everyone = set(names)
            return fresh & procs & leases, {"stale_heartbeat": len(everyone - fresh), "exited": len(everyone - procs),
                                            "lease_expired": len(everyone - leases)}

        submitted, t0, live_samples, misses = 0, time.monotonic(), [], Counter()
        with psycopg.connect(pg.url(), autocommit=True) as submitter:
            next_round, next_check = t0, t0 + 10
            while time.monotonic() - t0 < args.window:
                if time.monotonic() >= next_round:  # every instance gets one small task per round
                    for name in ready:
                        submitter.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
                        task_store.submit(submitter, "tick", {"n": submitted})
                        submitted += 1
                    next_round += args.task_every
                if time.monotonic() >= next_check:
                    live, why = live_now()
                    live_samples.append(len(live))
                    misses.update(why)
                    next_check += 10
                time.sleep(0.2)
        window = time.monotonic() - t0
        xact_rate = (xacts(bouncer) - xact_before) / window
        hb_rate = (sink.total - hb_before) / window
        live, why = live_now()
        live_samples.append(len(live))
        misses.update(why)
        time.sleep(args.poll_s + (1 if _run.SMOKE else 5))  # the last round's tasks finish
        stop.set()
        sampler.join()
        done = tasks_done(pg, names) - done_before
        rss, pss = memory(fleet)
        exits = Counter(p.poll() for p in fleet.procs.values() if p.poll() is not None)
        return {"instances": n, "ready": len(ready), "live": len(live), "live_min": min(live_samples),
                "live_samples": live_samples, "not_live_reasons": dict(misses), "boot_s": boot_s, "window_s": window,
                "server_sessions_max": max_sessions, "client_backends_max": max_backends,
                "rss_p50_mib": statistics.median(rss), "pss_p50_mib": statistics.median(pss),
                "rss_total_gib": sum(rss) / 1024, "pss_total_gib": sum(pss) / 1024,
                "heartbeats_per_s": hb_rate, "pooler_xacts_per_s": xact_rate, "tasks_submitted": submitted,
                "tasks_done": done, "exits": {str(k): v for k, v in exits.items()}}
    finally:
        fleet.stop()
        bouncer.stop()
        sink.server.shutdown()


def direct_run(pg: Postgres, tenants: list[dict[str, str]], args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """The anchor: the same server, each host connected directly, started in small batches until one fails."""
    sink = HeartbeatSink()
    fleet = Fleet(base)
    try:
        def env_for(t: dict[str, str]) -> dict[str, str]:
            dsn = psycopg.conninfo.make_conninfo(host="127.0.0.1", port=pg.port, dbname=DB, user=t["name"],
                                                 password=t["password"],
                                                 options=f"-c search_path={t['name']}")
            return host_env(t, dsn, False, base, sink, args)

        print("direct (anchor): starting hosts until the server refuses one", flush=True)
        ready, _ = boot(fleet, tenants, env_for, 5, timeout=60, stop_on_refusal=True)
        time.sleep(3 * args.heartbeat_s)
        sessions, backends = server_sessions(pg)
        alive = [n for n in ready if fleet.procs[n].poll() is None]
        refused = [n for n, p in fleet.procs.items() if p.poll() is not None]
        reason = ""
        if refused:
            log = (base / refused[0] / "host.log").read_text(errors="replace")
            reason = "too many clients" if "too many clients" in log or "remaining connection slots" in log \
                else log.strip().splitlines()[-1][-200:] if log.strip() else "exited"
        return {"live": len(alive), "server_sessions": sessions, "client_backends": backends,
                "refused": len(refused), "refusal": reason}
    finally:
        fleet.stop()
        sink.server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--instances", type=int, default=_run.size("BENCH_FLEET_INSTANCES", 200, smoke=3))
    parser.add_argument("--window", type=float, default=_run.seconds("BENCH_FLEET_WINDOW_S", 60.0, smoke=4.0),
                        help="seconds measured once every host is up")
    parser.add_argument("--max-connections", type=int, default=100)
    parser.add_argument("--max-db-connections", type=int, default=80,
                        help="PgBouncer's cap on server sessions to the tenant database, all tenant pools together")
    parser.add_argument("--pool-size", type=int, default=2, help="default_pool_size: per tenant role")
    parser.add_argument("--heartbeat-s", type=float, default=_run.seconds("BENCH_FLEET_HEARTBEAT_S", 2.0, smoke=1.0))
    parser.add_argument("--poll-s", type=float, default=_run.seconds("BENCH_FLEET_POLL_S", 2.0, smoke=0.5),
                        help="AGENT_POLL_INTERVAL_S of every instance")
    parser.add_argument("--task-every", type=float, default=_run.seconds("BENCH_FLEET_TASK_EVERY_S", 20.0, smoke=2.0),
                        help="each instance gets a task this often")
    parser.add_argument("--batch", type=int, default=10, help="hosts booted at once")
    parser.add_argument("--skip-anchor", action="store_true")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="cp-bench-fleet-"))
    pg = Postgres(args.max_connections)
    try:
        tenants = make_tenants(pg, args.instances)
        pooled = pooled_run(pg, tenants, args, base)
        direct = None if args.skip_anchor else direct_run(pg, tenants, args, base)
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Fleet on one PostgreSQL 15, max_connections {args.max_connections}, 2 cores "
                        f"(heartbeat {args.heartbeat_s} s, poll {args.poll_s} s, a task every {args.task_every} s)")
    for col in ("measure", "through PgBouncer", "direct (anchor)"):
        table.add_column(col)
    d = direct or {}
    table.add_row("live instances (end / min of samples every 10 s)",
                  f"{pooled['live']} / {pooled['live_min']} of {pooled['instances']}",
                  f"{d.get('live', '-')} ({d.get('refused', 0)} refused: {d.get('refusal', '')})" if direct else "-")
    table.add_row("server sessions of tenant roles (max seen)", str(pooled["server_sessions_max"]),
                  str(d.get("server_sessions", "-")))
    table.add_row("per-instance RSS / PSS, p50", f"{pooled['rss_p50_mib']:.0f} / {pooled['pss_p50_mib']:.0f} MiB", "")
    table.add_row("all instances' RSS / PSS", f"{pooled['rss_total_gib']:.1f} / {pooled['pss_total_gib']:.1f} GiB",
                  "")
    table.add_row("heartbeats received", f"{pooled['heartbeats_per_s']:.0f}/s", "")
    table.add_row("transactions through PgBouncer", f"{pooled['pooler_xacts_per_s']:.0f}/s", "")
    table.add_row(f"tasks done in {pooled['window_s']:.0f} s", f"{pooled['tasks_done']} of "
                  f"{pooled['tasks_submitted']} submitted", "")
    table.add_row("boot of all instances (batches)", f"{pooled['boot_s']:.0f} s", "")
    if direct:
        table.add_row("ratio", f"{pooled['live'] / max(1, d['live']):.1f}x the anchor's live instances", "anchor")
    Console(width=140).print(table)
    if direct:
        _run.ratio_line("fleet", "live instances, through PgBouncer / direct", pooled["live"] / max(1, d["live"]),
                        f"(direct {d['live']}, {d.get('refused', 0)} refused; a capacity count, not a time)")
    out = {"args": vars(args), "pooled": pooled, "direct": direct}
    _run.write_json("fleet", out)
    if pooled["live"] < pooled["instances"]:
        raise SystemExit(f"only {pooled['live']} of {pooled['instances']} instances live through PgBouncer")


if __name__ == "__main__":
    main()
