"""Issue 15: attacker code inside tenant A's real instance environment tries to cross every boundary.

Two customers are onboarded by a real Celery worker through the real workflow, with their real
instances running (sandboxed: the suite runs as root with bubblewrap). The attack is a Python
program started exactly as A's ``agent-host`` is (``instance_command``: A's uid, A's sandbox, A's
environment and nothing else). It goes after B's process environment, B's volume and object prefix,
the control plane's secrets directory, B's instance port and a password-protected Redis. Every
attempt must fail, and with the boundary's own error: ENOENT from A's own PID namespace or mount
namespace, EACCES from the kernel for A's uid, 401 from B's signature check, NOAUTH from Redis.

The same attack is also run as A's uid *without* the sandbox (``setpriv`` only), to show that each
file boundary holds twice: hidden by the sandbox, and refused by the kernel's permission check.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.conf import settings

from controlplane.ports import free_port, port_answers
from tests.conftest import Worker, kill_session_instances, wait_for
from tests.pg_servers import running_scram_server

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"),
                       reason="the sandbox needs root and bubblewrap (make system-deps installs it)"),
]

# Runs inside A's instance environment; prints one JSON object: attempt -> "ok: ..." or the error.
ATTACK = r'''
import errno, json, os, socket, sys, urllib.request, urllib.error
t = json.loads(sys.argv[1])
out = {}

def attempt(name, fn):
    try:
        out[name] = "ok: " + str(fn())[:200]
    except OSError as exc:
        out[name] = f"{type(exc).__name__}:{errno.errorcode.get(exc.errno, exc.errno)}"
    except Exception as exc:
        out[name] = f"{type(exc).__name__}:{str(exc)[:120]}"

attempt("whoami", lambda: os.getuid())
attempt("b_environ", lambda: open(f"/proc/{t['b_pid']}/environ", "rb").read())
def scan():
    seen = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if t["b_tenant"].encode() in open(f"/proc/{pid}/environ", "rb").read():
                    seen.append(pid)
            except OSError:
                pass
    return seen
out["b_in_any_visible_process"] = scan()
out["visible_pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
attempt("b_volume", lambda: os.listdir(t["b_volume"]))
attempt("b_volume_file", lambda: open(os.path.join(t["b_volume"], ".host", "agent-host.log")).read())
attempt("b_prefix", lambda: os.listdir(t["b_prefix"]))
attempt("secrets_dir", lambda: os.listdir(t["secrets_dir"]))
attempt("secret_file", lambda: open(t["secret_file"]).read())
attempt("own_volume_write", lambda: open(os.path.join(t["a_volume"], "workspace", "probe.txt"), "w").write("a"))

def redis(password):
    with socket.create_connection(("127.0.0.1", t["redis_port"]), timeout=3) as s:
        if password:
            s.sendall(f"*2\r\n$4\r\nAUTH\r\n${len(password)}\r\n{password}\r\n".encode())
            first = s.recv(200)
            if not first.startswith(b"+OK"):
                return first.decode().strip()
        s.sendall(b"*3\r\n$3\r\nSET\r\n$2\r\nhb\r\n$6\r\nforged\r\n")
        return s.recv(200).decode().strip()
out["redis_no_password"] = redis("")
out["redis_guessed_password"] = redis("guess-" + t["b_tenant"][:8])

import psycopg
own = psycopg.conninfo.conninfo_to_dict(os.environ["AGENT_DATABASE_URL"])
own.pop("options", None)

def login(**change):
    info = {**own, **change, "passfile": os.devnull, "connect_timeout": 5}
    with psycopg.connect(**info, autocommit=True) as conn:
        return conn.execute("SELECT current_user, current_database()").fetchone()

def temp_table():
    with psycopg.connect(os.environ["AGENT_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE stash (v text)")

attempt("db_own", lambda: login())
attempt("db_as_b_with_a_password", lambda: login(user=t["b_role"]))
attempt("db_as_b_without_password", lambda: login(user=t["b_role"], password=""))
attempt("db_superuser_with_a_password", lambda: login(user="postgres"))
attempt("db_superuser_without_password", lambda: login(user="postgres", password=""))
attempt("db_control_plane_database", lambda: login(dbname="controlplane"))
attempt("db_postgres_database", lambda: login(dbname="postgres"))
attempt("db_temp_table", temp_table)

if t.get("b_port"):
    sys.path.insert(0, t["source"])
    from instances.signing import sign
    for who in ("a", "b"):
        tenant = t["a_tenant"] if who == "a" else t["b_tenant"]
        req = urllib.request.Request(f"http://127.0.0.1:{t['b_port']}/v1/tasks",
                                     headers={"Authorization": sign(os.environ["AGENT_INSTANCE_TOKEN"], tenant,
                                                                     "GET", "/v1/tasks")})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                out[f"b_port_signed_as_{who}"] = f"ok: {resp.status}"
        except urllib.error.HTTPError as exc:
            out[f"b_port_signed_as_{who}"] = f"HTTP {exc.code} {exc.read().decode()[:120]}"
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory):  # type: ignore[no-untyped-def]
    """A redis-server of this test's own with ``requirepass`` (the machine's Redis has none)."""
    password = secrets.token_urlsafe(24)
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--requirepass", password, "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: port_answers(port), timeout=20, what="redis-server with requirepass")
    yield {"port": port, "password": password, "url": f"redis://:{password}@127.0.0.1:{port}/0"}
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="module")
def scram_server():  # type: ignore[no-untyped-def]
    with running_scram_server() as server:
        yield server


@pytest.fixture(scope="module", params=["exec", "fork"])
def pair(request, django_db_setup, django_db_blocker, scram_server):  # type: ignore[no-untyped-def]
    """Two onboarded tenants of two operators, both instances running in their sandboxes, launched each way
    (``LOCAL_INSTANCE_LAUNCH``): a forked instance must stand every test an exec'd one does.

    Their schemas and roles live on a SCRAM server of this module's own (the machine's trusts every
    local login, so no password could be refused there), provisioned without the insecure-auth override.
    """
    from django.core.management import call_command

    from provisioning.workflows.onboarding import tenant_onboard
    from tenants.actors import SYSTEM
    from tenants.models import Tenant
    from tenants.services import operator_create

    saved = settings.TENANT_DATABASE_URL, settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH, settings.LOCAL_INSTANCE_LAUNCH
    settings.LOCAL_INSTANCE_LAUNCH = request.param
    settings.TENANT_DATABASE_URL = scram_server.url("tenantdb")
    settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH = False
    try:
        with django_db_blocker.unblock():
            tag = secrets.token_hex(3)
            worker = Worker(TENANT_DATABASE_URL=settings.TENANT_DATABASE_URL,
                            TENANT_DATABASE_ALLOW_INSECURE_AUTH="false", LOCAL_INSTANCE_LAUNCH=request.param)
            try:
                tenants = []
                for letter in ("a", "b"):
                    op = operator_create(slug=f"iso-{letter}-{tag}", name=f"Operator {letter}", actor=SYSTEM)
                    tenant, _ = tenant_onboard(operator=op, slug=f"cust-{letter}", name=f"Customer {letter}",
                                               actor=SYSTEM, allow_no_release=True)
                    tenants.append(tenant)
                for tenant in tenants:
                    wait_for(lambda t=tenant: Tenant.objects.get(pk=t.pk).status in ("ready", "failed"),
                             timeout=120, what=f"{tenant.slug} onboarded")
                    tenant.refresh_from_db()
                    assert tenant.status == "ready", (tenant.status_reason, worker.log()[-3000:])
            finally:
                worker.stop()
            try:
                _apply_the_posture_fix_for_other_databases(scram_server)
                yield {"a": tenants[0], "b": tenants[1], "launch": request.param}
            finally:
                kill_session_instances()  # their database goes away with the module's server
                call_command("flush", interactive=False, verbosity=0)
    finally:
        (settings.TENANT_DATABASE_URL, settings.TENANT_DATABASE_ALLOW_INSECURE_AUTH,
         settings.LOCAL_INSTANCE_LAUNCH) = saved


_connect_revoked: set[int] = set()


def _apply_the_posture_fix_for_other_databases(server: Any) -> None:
    """On a configured server the product revokes PUBLIC's CONNECT only where it owns the database (the tenant
    database, its own); the others it reports. Here they are the server's ``postgres`` and a database standing
    for the control plane's: the posture names them, and the operator applies the fix it gives."""
    import psycopg
    from psycopg import sql

    from provisioning.fleet.posture import isolation_posture

    if server.port in _connect_revoked:  # the module's other launch (the pair is made once per launch) did it
        return
    _connect_revoked.add(server.port)
    line = next(x for x in isolation_posture() if x.boundary == "database connect")
    assert line.status == "degraded" and "controlplane" in line.detail and "postgres" in line.detail, line
    assert line.fix.startswith("REVOKE CONNECT ON DATABASE"), line
    with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
        for db in ("controlplane", "postgres", "template1"):
            conn.execute(sql.SQL("REVOKE CONNECT, TEMP ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db)))
    line = next(x for x in isolation_posture() if x.boundary == "database connect")
    assert line.status == "pass", line


def _spec(tenant: Any) -> Any:
    from provisioning.resources.spec import tenant_spec

    return tenant_spec(tenant, with_secrets=("db_password", "object_key_b64", "instance_token"))


def _targets(pair: dict[str, Any], redis_port: int) -> dict[str, Any]:
    from controlplane.secretfiles import DEV_SECRET_KEY_FILE, dev_secret, dev_secret_path
    from provisioning.drivers.local_process import live_host_pid

    a, b = _spec(pair["a"]), _spec(pair["b"])
    dev_secret(settings.VAR_DIR, DEV_SECRET_KEY_FILE)  # the secrets directory exists, with a real secret in it
    secret_file = dev_secret_path(settings.VAR_DIR, DEV_SECRET_KEY_FILE)
    b_volume = Path(b.resources["volume"].details["path"])
    return {
        "b_pid": live_host_pid(b), "b_tenant": str(pair["b"].pk), "a_tenant": str(pair["a"].pk),
        "b_volume": str(b_volume), "a_volume": a.resources["volume"].details["path"],
        "b_prefix": b.resources["objectstore"].details["url"].removeprefix("file://"),
        "secrets_dir": str(secret_file.parent), "secret_file": str(secret_file),
        "redis_port": redis_port, "b_port": int((b_volume / ".host" / "http-port").read_text()),
        "source": str(settings.BASE_DIR), "b_role": b.resources["database"].details["role"],
    }


def _run_as_a(pair: dict[str, Any], targets: dict[str, Any], *, sandbox: bool) -> dict[str, Any]:
    from provisioning.drivers.local_process import instance_command
    from provisioning.drivers.local_sandbox import drop_privileges_argv, ensure_instance_user

    command = [sys.executable, "-c", ATTACK, json.dumps(targets)]
    argv, env = instance_command(_spec(pair["a"]), command)
    if not sandbox:  # the same uid and environment, without bwrap: only the kernel's permission checks
        argv = [*drop_privileges_argv(ensure_instance_user(_spec(pair["a"]))), *command]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_instance_runs_as_its_own_user_with_only_its_own_environment(pair):
    from provisioning.drivers.local_process import live_host_pid
    from provisioning.models import ProvisionedResource

    users = {}
    for letter in ("a", "b"):
        spec = _spec(pair[letter])
        proc = psutil.Process(live_host_pid(spec))
        uid = _uid(pair[letter])
        assert proc.uids().real == proc.uids().effective == uid >= settings.LOCAL_INSTANCE_UID_BASE
        assert proc.gids().real == uid
        with pytest.raises(KeyError):  # a number of its own, in no /etc/passwd
            pwd.getpwuid(uid)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert "CapEff:\t0000000000000000" in status and "NoNewPrivs:\t1" in status
        env = proc.environ()
        other = pair["b" if letter == "a" else "a"]
        assert env["AGENT_TENANT_ID"] == str(pair[letter].pk)
        assert not any(str(other.pk) in v or other.resource_name in v for v in env.values())
        assert not {"DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "VAULT_KEK_KEYRING"} & set(env)
        volume = Path(spec.resources["volume"].details["path"])
        assert volume.stat().st_uid == uid and (volume.stat().st_mode & 0o777) == 0o700
        runtime = ProvisionedResource.objects.get(tenant=pair[letter], kind="runtime")
        assert runtime.details["isolation"] == "sandboxed" and runtime.details["os_uid"] == uid
        users[letter] = uid
    assert users["a"] != users["b"]


def test_attacker_in_a_sandbox_cannot_reach_b_or_the_control_plane(pair, redis_with_password):
    targets = _targets(pair, redis_with_password["port"])
    # The targets are real: seen from outside, B's process, files and the secret exist.
    assert psutil.pid_exists(targets["b_pid"])
    assert Path(targets["b_volume"], ".host", "agent-host.log").exists()
    assert Path(targets["b_prefix"]).is_dir() and Path(targets["secret_file"]).read_text().strip()

    seen = _run_as_a(pair, targets, sandbox=True)
    assert seen["whoami"] == f"ok: {_uid(pair['a'])}"
    assert seen["own_volume_write"].startswith("ok"), seen
    # Its own PID namespace: B's host does not exist for A, and no visible process carries B's id.
    assert seen["b_environ"] == "FileNotFoundError:ENOENT", seen
    assert seen["b_in_any_visible_process"] == [] and max(seen["visible_pids"]) < 10, seen
    # Its own mount namespace: B's volume and prefix and the control plane's var/ are empty tmpfs.
    for name in ("b_volume", "b_volume_file", "b_prefix", "secrets_dir", "secret_file"):
        assert seen[name] == "FileNotFoundError:ENOENT", (name, seen[name])
    # B's instance API: A's own key is not B's, whichever tenant the request names.
    assert seen["b_port_signed_as_a"].startswith("HTTP 401"), seen
    assert seen["b_port_signed_as_b"].startswith("HTTP 401"), seen
    # PostgreSQL (SCRAM on every line): A's own login works; B's role, the superuser, other databases and
    # temporary tables do not, each refused by the server for its own reason.
    assert seen["db_own"].startswith("ok:") and seen["db_own"].endswith(", 'tenantdb')"), seen
    for name in ("db_as_b_with_a_password", "db_superuser_with_a_password"):
        assert "password authentication failed" in seen[name], (name, seen[name])
    for name in ("db_as_b_without_password", "db_superuser_without_password"):  # the server asked for one
        assert "no password supplied" in seen[name], (name, seen[name])
    for name in ("db_control_plane_database", "db_postgres_database"):
        assert "permission denied for database" in seen[name], (name, seen[name])
    assert "permission denied to create temporary tables" in seen["db_temp_table"], seen
    # Redis with requirepass: nothing without the password, nothing with a guess.
    assert seen["redis_no_password"].startswith("-NOAUTH"), seen
    assert seen["redis_guessed_password"].startswith("-WRONGPASS"), seen


def test_without_the_sandbox_the_kernel_still_refuses_a_uid(pair, redis_with_password):
    targets = _targets(pair, redis_with_password["port"])
    seen = _run_as_a(pair, targets, sandbox=False)
    assert seen["whoami"] == f"ok: {_uid(pair['a'])}"
    # B's process is visible here (no PID namespace) but its environment is B's uid's alone.
    assert seen["b_environ"] == "PermissionError:EACCES", seen
    assert seen["b_in_any_visible_process"] == [], seen
    for name in ("b_volume", "b_volume_file", "b_prefix", "secrets_dir", "secret_file"):
        assert seen[name] == "PermissionError:EACCES", (name, seen[name])


# Run as tenant A's forked host runs, outside any sandbox (its uid, no capabilities): the fork server is root's.
FORK_SERVER_PROBE = r"""
import json, sys
found = {}
for name in ("mem", "environ", "maps"):
    try:
        with open(f"/proc/{sys.argv[1]}/{name}", "rb") as fh:
            fh.read(1)
        found[name] = "read"
    except OSError as exc:
        found[name] = type(exc).__name__
print(json.dumps(found))
"""
# Run inside tenant A's forked host's own namespaces and root, as its uid: what it sees of the machine.
INSIDE_PROBE = r"""
import json, os
pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
print(json.dumps([[int(open(f"/proc/{p}/status").read().split("Uid:")[1].split()[0]),
                   open(f"/proc/{p}/cmdline").read().split("\0")[0]] for p in sorted(pids)]))
"""


def test_a_forked_host_has_its_placeholders_sandbox_and_nothing_of_the_fork_server(pair):
    """LOCAL_INSTANCE_LAUNCH=fork: the host, forked by a root process, holds exactly the sandbox the exec launch
    builds (taken from the placeholder bubblewrap started): same namespaces, cgroups and rlimits; its uid alone,
    no capability at all, no_new_privs; no descriptor of the server's; and the server's memory out of its reach."""
    if pair["launch"] != "fork":
        pytest.skip("the fork launch's own properties")
    from provisioning.drivers.local_fork import PLACEHOLDER_ARGV, SERVER_MODULE
    from provisioning.drivers.local_process import live_host_pid
    from provisioning.drivers.local_sandbox import drop_privileges_argv, ensure_instance_user

    host = live_host_pid(_spec(pair["a"]))
    assert host is not None
    uid = _uid(pair["a"])
    status = dict(line.split(":", 1) for line in Path(f"/proc/{host}/status").read_text().splitlines())
    assert status["Uid"].split() == [str(uid)] * 4 and status["Gid"].split() == [str(uid)] * 4
    assert status["Groups"].strip() == ""
    for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[caps], 16) == 0, (caps, status[caps])
    assert status["NoNewPrivs"].strip() == "1"
    placeholders = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == PLACEHOLDER_ARGV
                    and os.stat(f"/proc/{p.pid}/ns/mnt").st_ino == os.stat(f"/proc/{host}/ns/mnt").st_ino]
    assert len(placeholders) == 1, placeholders
    holder = placeholders[0].pid
    for ns in ("mnt", "net", "ipc", "uts", "pid", "cgroup"):
        ours = os.stat(f"/proc/{host}/ns/{ns}").st_ino
        assert ours == os.stat(f"/proc/{holder}/ns/{ns}").st_ino, ns
        # The suite pins a shared network here (tests/conftest.py); test_isolation_network.py runs isolated ones.
        assert ns == "net" or ours != os.stat(f"/proc/self/ns/{ns}").st_ino, ns
    assert Path(f"/proc/{host}/cgroup").read_text() == Path(f"/proc/{holder}/cgroup").read_text()
    assert Path(f"/proc/{host}/limits").read_text() == Path(f"/proc/{holder}/limits").read_text()
    # A record naming its sandbox (a start cut short after the spawn) still finds the host, as for an exec'd one.
    from provisioning.drivers.local_process import PID_FILE

    sandbox = [p for p in psutil.Process(holder).parents() if p.name() == "bwrap"][-1]
    pid_file = Path(_spec(pair["a"]).resources["volume"].details["path"]) / ".host" / PID_FILE
    pid_file.write_text(str(sandbox.pid))
    assert live_host_pid(_spec(pair["a"])) == host and pid_file.read_text() == str(host)
    # Its own session (no terminal to push input into), and only its own descriptors: none of the server's socket,
    # none of the memfd its environment came in.
    assert os.getsid(host) != os.getsid(0)
    links = [os.readlink(f"/proc/{host}/fd/{fd}") for fd in os.listdir(f"/proc/{host}/fd")]
    assert not [link for link in links if "instance-env" in link or "forkserver" in link], links
    # The fork server's memory (every child's starting image) is root's: not readable with the tenant's uid.
    server = psutil.Process(host).parent()  # the server reaps its hosts
    assert server.cmdline()[1:3] == ["-m", SERVER_MODULE] and server.uids().real == 0
    server = server.pid
    argv = [*drop_privileges_argv(ensure_instance_user(_spec(pair["a"]))), sys.executable, "-c", FORK_SERVER_PROBE,
            str(server)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"mem": "PermissionError", "environ": "PermissionError",
                                       "maps": "PermissionError"}, done.stdout
    # Inside the host's namespaces and root, as its uid: what an exec'd host sees (bubblewrap's init as pid 1, the
    # tenant's own processes), and no fork server.
    inside = subprocess.run(["nsenter", "-t", str(host), "-m", "-p", "-n", "-i", "-u", "-r", "-w",
                             "-S", str(uid), "-G", str(uid), sys.executable, "-c", INSIDE_PROBE],
                            capture_output=True, text=True, timeout=60, check=False)
    assert inside.returncode == 0, inside.stderr[-2000:]
    seen = json.loads(inside.stdout)
    assert seen[0][0] == 0 and seen[0][1].endswith("bwrap") and {u for u, _ in seen[1:]} == {uid}, seen
    names = sorted(Path(cmd).name for _, cmd in seen[1:])
    assert len(names) == 2 and names[0].startswith("python") and names[1] == "sh", seen  # the host, the placeholder


def _uid(tenant: Any) -> int:
    from provisioning.models import InstanceIdentity

    return int(settings.LOCAL_INSTANCE_UID_BASE + InstanceIdentity.objects.get(tenant_id=tenant.pk).pk)


def test_control_plane_uses_the_password_protected_redis(redis_with_password, settings):
    """Heartbeats (what A would forge) work through the password URL; the posture sees the server closed."""
    from provisioning.fleet.posture import redis_answers_without_password
    from provisioning.recovery.heartbeats import RedisHeartbeatStore

    store = RedisHeartbeatStore(redis_with_password["url"], f"iso-{secrets.token_hex(3)}")
    store.record("instance-1", {"status": "idle", "progress_seq": 1}, now=time.time())
    beat = store.get("instance-1")
    assert beat is not None and beat.progress.get("status") == "idle", beat
    assert redis_answers_without_password(redis_with_password["url"]) is False
    import redis

    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=redis_with_password["port"]).ping()


def test_deprovision_retires_the_instance_identity_and_never_reissues_it(pair):
    from provisioning.drivers.local_process import LocalProcessDriver
    from provisioning.drivers.local_sandbox import instance_uid, remove_instance_user
    from provisioning.models import InstanceIdentity

    spec = _spec(pair["b"])
    uid = _uid(pair["b"])
    LocalProcessDriver().stop(spec, grace_s=10)
    remove_instance_user(spec)
    assert InstanceIdentity.objects.get(tenant_id=pair["b"].pk).released_at is not None
    # B's files (its volume) are still owned by B's uid: the next tenant gets another number.
    assert Path(spec.resources["volume"].details["path"]).stat().st_uid == uid
    assert instance_uid(str(uuid.uuid4())) > uid
