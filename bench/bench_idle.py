"""Idle instances (issue 39): what one idle ``agent-host`` costs in memory and CPU, beside the floor of a minimal
asyncio HTTP server measured in the same run. Goal: <= 40 MiB PSS and <= 0.1% of a core per idle instance.

The run makes N tenants on the machine's PostgreSQL (``BENCH_POSTGRES_URL``; one database, a LOGIN role and a schema
each, as provisioning makes them) and starts N real ``agent-host`` processes with the environment the local driver
gives an instance of a customer without a release: the runtime's installed agents (the examples' entry points),
heartbeats to a sink in this process at the default interval, the default poll interval. Once all are ready and have
settled, each is left alone for the window; then, per instance: PSS (``memory_full_info().pss``, the host plus the
PostgreSQL backends it holds, which count against the same machine), CPU over the window (user + system, host and
backends, as a share of one core), its PostgreSQL sessions and its threads. The floor: up to 40
(``BENCH_IDLE_FLOORS``) minimal asyncio HTTP servers (``asyncio.start_server``, one answer per request), measured
over the same window, interleaved with the hosts (started after them, measured at the same time).

Printed: both, side by side, the instances that would fit this machine by memory and by CPU, the load average, and
``ratio idle: ...`` lines. ``BENCH_IDLE_INSTANCES`` (20; 1,000 to fill the machine: mind the shared cores),
``BENCH_IDLE_WINDOW_S`` (60), ``BENCH_IDLE_FLOORS`` (floor servers, at most N: 40), ``BENCH_IDLE_HEARTBEAT_S`` (the
host's default, 2.0), ``BENCH_IDLE_KINDS`` (unset: every installed agent, as an instance without a release;
``demo,forward``: what the control plane gives an instance whose release declares those kinds, ``AGENT_KINDS``, so
the others' modules are never imported; issue 39), ``BENCH_IDLE_LAUNCH`` (``exec``; ``fork``: each host forked from
one ``agent_runtime.host.forkserver`` into a placeholder sandbox of its own, bubblewrap's PID/IPC/UTS namespaces and
a uid of its own, as ``LOCAL_INSTANCE_LAUNCH=fork`` does; the PSS then counts the host, its sandbox's processes and,
spread over the instances, the fork server).
"""

from __future__ import annotations

import array
import base64
import contextlib
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _run  # noqa: E402
from bench.bench_fleet import HeartbeatSink  # noqa: E402

N = _run.size("BENCH_IDLE_INSTANCES", 20, smoke=2)
WINDOW_S = _run.seconds("BENCH_IDLE_WINDOW_S", 60.0, smoke=5.0)
SETTLE_S = _run.seconds("BENCH_IDLE_SETTLE_S", 5.0, smoke=1.0)
HEARTBEAT_S = os.environ.get("BENCH_IDLE_HEARTBEAT_S", "2.0")
KINDS = os.environ.get("BENCH_IDLE_KINDS", "")
LAUNCH = os.environ.get("BENCH_IDLE_LAUNCH", "exec")
# The floor is a per-instance reference, so a sample of it does: at N = 1,000, as many floor servers (~11 MiB
# each) beside the hosts would not fit the machine the hosts are meant to fill.
FLOORS = min(N, _run.size("BENCH_IDLE_FLOORS", 40, smoke=2))
UID_BASE = 3_900_000  # the forked hosts' uids (the control plane's are LOCAL_INSTANCE_UID_BASE + n)
PLACEHOLDER = ["/bin/sh", "-c", "while read -r _; do :; done", "agent-host-placeholder"]
SERVER = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
MACHINE_MIB = psutil.virtual_memory().total / 2**20
CORES = psutil.cpu_count() or 1

# The floor: the least a Python process answering HTTP on its own socket costs while nobody calls it.
FLOOR_SERVER = """
import asyncio, sys
async def answer(reader, writer):
    try:
        await reader.readuntil(b"\\r\\n\\r\\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok")
    await writer.drain()
    writer.close()
async def main():
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def make_tenants(dsn: str, n: int) -> list[str]:
    """N roles, each owning its schema (``provisioning/drivers/local_postgres``'s statements, in short)."""
    names = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(n):
            name = f"idle_{i:04d}_{secrets.token_hex(3)}"
            ident = sql.Identifier(name)
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
            conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(ident, ident))
            conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(ident))
            conn.execute(sql.SQL("ALTER ROLE {} SET search_path TO {}").format(ident, ident))
            names.append(name)
    return names


def host_env(name: str, dsn: str, base: Path, sink: HeartbeatSink) -> dict[str, str]:
    volume, objects = base / name / "volume", base / name / "objects"
    volume.mkdir(parents=True, exist_ok=True, mode=0o700)
    objects.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_")}
    env.update({
        # This checkout's examples, not whichever the environment installed (a worktree shares a venv).
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "examples"))),
        "AGENT_TENANT_ID": str(uuid.uuid4()), "AGENT_SCHEMA": name,
        "AGENT_DATABASE_URL": psycopg.conninfo.make_conninfo(dsn, user=name),
        "AGENT_VOLUME": str(volume), "AGENT_OBJECTSTORE_URL": f"file://{objects}/",
        "AGENT_OBJECT_KEY": base64.b64encode(os.urandom(32)).decode(),
        "AGENT_CONTROL_PLANE_URL": sink.url, "AGENT_INSTANCE_TOKEN": name,
        "AGENT_HEARTBEAT_INTERVAL_S": HEARTBEAT_S,
        **({"AGENT_KINDS": KINDS} if KINDS else {}),
    })
    return env


def start_fork_server(base: Path) -> tuple[subprocess.Popen[bytes], Path]:
    path = base / "forkserver.sock"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "examples")))}
    proc = subprocess.Popen([sys.executable, "-m", "agent_runtime.host.forkserver", str(path)], env=env,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()  # ready
    return proc, path


def forked_host(server: Path, env: dict[str, str], uid: int, log: Any) -> tuple[subprocess.Popen[bytes], int]:
    """(the sandbox process, the host's pid): the placeholder sandbox, then the host forked into it."""
    volume = Path(env["AGENT_VOLUME"])
    for path in (volume, volume.parent, volume.parent / "objects"):
        os.chown(path, uid, uid)
    # The interpreter may live in root's 0700 home (pyenv): bound back into an empty one, as the driver does.
    interpreter = Path(sys.base_prefix).resolve()
    home = []
    if Path("/root") in interpreter.parents:
        home = ["--tmpfs", "/root"]
        for parent in reversed(interpreter.parents):
            if Path("/root") in parent.parents:
                home += ["--perms", "0711", "--dir", str(parent)]
        home += ["--ro-bind", str(interpreter), str(interpreter)]
    read_end, write_end = os.pipe()
    sandbox = subprocess.Popen([shutil.which("bwrap") or "bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                                "--new-session", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *home,
                                "--chdir", str(volume), "--", "setpriv", "--reuid", str(uid), "--regid", str(uid),
                                "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                                *PLACEHOLDER], stdin=read_end, stdout=log, stderr=subprocess.STDOUT)
    os.close(read_end)
    placeholder = None
    while placeholder is None:
        for child in psutil.Process(sandbox.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.cmdline() == PLACEHOLDER and child.uids().real == uid:
                    placeholder = child.pid
        time.sleep(0.01)
    env_fd = os.memfd_create("instance-env")
    os.write(env_fd, json.dumps(env).encode())
    os.lseek(env_fd, 0, os.SEEK_SET)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(server))
        fds = array.array("i", [env_fd, log.fileno(), write_end])
        sock.sendmsg([json.dumps({"placeholder": placeholder, "uid": uid, "gid": uid, "cgroups": []}).encode()],
                      [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
        reply = json.loads(sock.makefile().readline())
    os.close(env_fd)
    os.close(write_end)
    return sandbox, int(reply["pid"])


def sandbox_pids(sandbox: subprocess.Popen[bytes], host: int) -> list[int]:
    """The host and the processes of the sandbox around it (bubblewrap, its init, the placeholder)."""
    with contextlib.suppress(psutil.Error):
        return [host, sandbox.pid, *(c.pid for c in psutil.Process(sandbox.pid).children(recursive=True)
                                     if c.pid != host)]
    return [host]


def ready(proc: subprocess.Popen[bytes], volume: Path) -> bool | None:
    if proc.poll() is not None:
        return False
    try:
        port = (volume / ".host" / "http-port").read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:  # noqa: S310 - loopback
            return bool(resp.status == 200)
    except (OSError, ValueError, urllib.error.URLError):
        return None


def backends(dsn: str, roles: list[str]) -> dict[str, list[int]]:
    """role -> pids of the PostgreSQL backends it holds now."""
    out: dict[str, list[int]] = {r: [] for r in roles}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role, pid in conn.execute("SELECT usename, pid FROM pg_stat_activity WHERE usename = ANY(%s)", (roles,)):
            out[role].append(pid)
    return out


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def pss_mib(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().pss / 2**20
    return total


def threads(pid: int) -> int:
    with contextlib.suppress(psutil.Error):
        return int(psutil.Process(pid).num_threads())
    return 0


def summary(label: str, pss: list[float], cpu_pct: list[float], sessions: list[int], nthreads: list[int],
            backend_pss: list[float], backend_cpu: list[float]) -> dict[str, Any]:
    per_mib = statistics.mean(pss)
    per_cpu = statistics.mean(cpu_pct)
    row = {"label": label, "n": len(pss), "pss_mib_mean": round(per_mib, 1), "pss_mib_max": round(max(pss), 1),
           "backend_pss_mib_mean": round(statistics.mean(backend_pss), 1),
           "cpu_pct_of_core_mean": round(per_cpu, 3), "cpu_pct_of_core_max": round(max(cpu_pct), 3),
           "backend_cpu_pct_of_core_mean": round(statistics.mean(backend_cpu), 3),
           "sessions_mean": round(statistics.mean(sessions), 1), "threads_mean": round(statistics.mean(nthreads), 1),
           "fit_by_memory": int(MACHINE_MIB / per_mib) if per_mib else None,
           "fit_by_cpu": int(CORES * 100 / per_cpu) if per_cpu > 0 else None}
    print(f"{label:<28} n={row['n']:<5} PSS {row['pss_mib_mean']:>6.1f} MiB (max {row['pss_mib_max']:.1f}; "
          f"of it PostgreSQL {row['backend_pss_mib_mean']:.1f})  CPU {row['cpu_pct_of_core_mean']:.3f}% of a core "
          f"(max {row['cpu_pct_of_core_max']:.3f}; of it PostgreSQL {row['backend_cpu_pct_of_core_mean']:.3f})"
          f"  sessions {row['sessions_mean']}  threads {row['threads_mean']}  "
          f"fit: {row['fit_by_memory']} by memory, {row['fit_by_cpu'] or 'unbounded'} by CPU", flush=True)
    return row


def main() -> None:
    admin = psycopg.conninfo.make_conninfo(SERVER, dbname="postgres")
    dbname = f"idle_{secrets.token_hex(4)}"
    base = Path(tempfile.mkdtemp(prefix="cp-bench-idle-"))
    hosts: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    floors: list[subprocess.Popen[bytes]] = []
    roles: list[str] = []
    host_pids: dict[str, list[int]] = {}
    with _run.Cleanup() as cleanup:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        dsn = psycopg.conninfo.make_conninfo(admin, dbname=dbname)

        def drop() -> None:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
                for role in roles:
                    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))

        cleanup.add("drop the database and roles", drop)
        if not os.environ.get("BENCH_IDLE_KEEP"):
            cleanup.add("remove the volumes", lambda: subprocess.run(["rm", "-rf", str(base)], check=False))
        roles.extend(make_tenants(dsn, N))
        sink = HeartbeatSink()
        cleanup.add("stop the heartbeat sink", sink.server.shutdown)

        def stop_all() -> None:
            for pids in host_pids.values():  # a forked host's exit ends its sandbox (the lifeline)
                with contextlib.suppress(OSError):
                    os.kill(pids[0], 15)
            for proc in [p for p, _ in hosts.values()] + floors:
                if proc.poll() is None:
                    proc.terminate()
            for proc in [p for p, _ in hosts.values()] + floors:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            # A forked host is the fork server's child, not ours: its sandbox can be gone while it still writes its
            # volume on the way out, under the clean-up's `rm` (which then failed on a non-empty directory).
            alive = []
            for pids in host_pids.values():
                with contextlib.suppress(psutil.Error):
                    alive.append(psutil.Process(pids[0]))
            _gone, left = psutil.wait_procs(alive, timeout=30)
            for proc in left:
                with contextlib.suppress(psutil.Error):
                    proc.kill()

        cleanup.add("stop the hosts and the floor servers", stop_all)
        server_pss = 0.0
        if LAUNCH == "fork":
            os.chmod(base, 0o711)
            server, server_path = start_fork_server(base)
            cleanup.add("stop the fork server", server.kill)
        t0 = time.monotonic()
        for role in roles:  # in batches of 10, so 2 cores are not asked to boot 1,000 interpreters at once
            env = host_env(role, dsn, base, sink)
            log = (base / role / "host.log").open("ab")
            if LAUNCH == "fork":
                sandbox, host_pid = forked_host(server_path, env, UID_BASE + len(hosts), log)
                hosts[role] = (sandbox, Path(env["AGENT_VOLUME"]))
                host_pids[role] = sandbox_pids(sandbox, host_pid)
            else:
                hosts[role] = (subprocess.Popen([sys.executable, "-m", "agent_runtime.host"], env=env, cwd=ROOT,
                                                stdout=log, stderr=subprocess.STDOUT), Path(env["AGENT_VOLUME"]))
                host_pids[role] = [hosts[role][0].pid]
            log.close()
            if len(hosts) % 10 == 0:
                while sum(ready(p, v) is None for p, v in hosts.values()) > 10:
                    time.sleep(0.2)
        state: dict[str, bool | None] = dict.fromkeys(roles)
        deadline = time.monotonic() + 120 + N
        while time.monotonic() < deadline and any(v is None for v in state.values()):
            for role in [r for r, v in state.items() if v is None]:
                state[role] = ready(*hosts[role])
            time.sleep(0.2)
        failed = [r for r, v in state.items() if not v]
        if failed:
            raise RuntimeError(f"{len(failed)} hosts never became ready, e.g.:\n"
                               + (base / failed[0] / "host.log").read_text()[-2000:])
        print(f"{N} hosts ready in {time.monotonic() - t0:.1f} s", flush=True)
        for _ in range(FLOORS):
            proc = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER], stdout=subprocess.PIPE)
            assert proc.stdout is not None
            proc.stdout.readline()  # listening
            floors.append(proc)
        time.sleep(SETTLE_S)  # boot's garbage collected, the first heartbeats sent

        pids = backends(dsn, roles)
        host_cpu0 = {r: cpu_s(host_pids[r]) for r in roles}
        backend_cpu0 = {r: cpu_s(pids[r]) for r in roles}
        floor_cpu0 = [cpu_s([p.pid]) for p in floors]
        beats0 = sink.total
        load0 = os.getloadavg()
        started = time.monotonic()
        time.sleep(WINDOW_S)
        elapsed = time.monotonic() - started
        beats = sink.total - beats0
        pids_after = backends(dsn, roles)
        # The same backends as at the start (a session opened during the window would count from zero): the host's
        # two sessions are held for its life.
        backend_cpu = [100 * (cpu_s(pids[r]) - backend_cpu0[r]) / elapsed for r in roles]
        host_cpu = [100 * (cpu_s(host_pids[r]) - host_cpu0[r]) / elapsed + b
                    for r, b in zip(roles, backend_cpu, strict=True)]
        floor_cpu = [100 * (cpu_s([p.pid]) - c0) / elapsed for p, c0 in zip(floors, floor_cpu0, strict=True)]
        backend_pss = [pss_mib(pids_after[r]) for r in roles]
        if LAUNCH == "fork":
            server_pss = pss_mib([server.pid]) / N
        host_pss = [pss_mib(host_pids[r]) + b + server_pss for r, b in zip(roles, backend_pss, strict=True)]
        floor_pss = [pss_mib([p.pid]) for p in floors]
        load1 = os.getloadavg()
        print(f"\nidle window {elapsed:.0f} s; load average {load0[0]:.2f} -> {load1[0]:.2f} (1 min), "
              f"{load1[1]:.2f} (5 min); {CORES} cores, {MACHINE_MIB / 1024:.1f} GiB; heartbeats received "
              f"{beats / elapsed / N:.2f}/s per instance; agent kinds: {KINDS or 'every installed one'}", flush=True)
        if LAUNCH == "fork":
            own = [pss_mib(host_pids[r][:1]) for r in roles]
            box = [pss_mib(host_pids[r][1:]) for r in roles]
            print(f"fork: per instance the host {statistics.mean(own):.1f} MiB PSS, its sandbox's processes "
                  f"{statistics.mean(box):.1f}, the fork server's share {server_pss:.1f} "
                  f"({server_pss * N:.1f} in all)", flush=True)
        ours = summary(f"idle agent-host ({LAUNCH})", host_pss, host_cpu, [len(pids_after[r]) for r in roles],
                       [threads(host_pids[r][0]) for r in roles], backend_pss, backend_cpu)
        floor = summary("asyncio HTTP server (floor)", floor_pss, floor_cpu, [0] * len(floors),
                        [threads(p.pid) for p in floors], [0.0] * len(floors), [0.0] * len(floors))
        goal_mib, goal_cpu = 40.0, 0.1
        print(f"goal: <= {goal_mib:.0f} MiB and <= {goal_cpu}% of a core per idle instance: memory "
              f"{'met' if ours['pss_mib_mean'] <= goal_mib else 'NOT met'}, CPU "
              f"{'met' if ours['cpu_pct_of_core_mean'] <= goal_cpu else 'NOT met'}", flush=True)
        _run.ratio_line("idle", "PSS per idle instance", ours["pss_mib_mean"] / floor["pss_mib_mean"],
                        "vs a minimal asyncio HTTP server's")
        _run.ratio_line("idle", "PSS per idle instance", ours["pss_mib_mean"] / goal_mib, "of the 40 MiB goal")
        _run.ratio_line("idle", "CPU per idle instance", ours["cpu_pct_of_core_mean"] / goal_cpu,
                        "of the 0.1%-of-a-core goal")
        _run.write_json("idle", {"instances": N, "window_s": round(elapsed, 1), "load_avg": [load0, load1],
                                 "kinds": KINDS or None, "launch": LAUNCH,
                                 "heartbeat_interval_s": float(HEARTBEAT_S), "host": ours,
                                 "floor": floor})


if __name__ == "__main__":
    main()
