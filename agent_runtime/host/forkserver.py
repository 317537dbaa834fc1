"""The fork server of ``LOCAL_INSTANCE_LAUNCH=fork``: one pre-imported, tenant-free parent per machine.

An idle ``agent-host`` costs ~33 MiB of private memory, nearly all of it the interpreter's heap after its imports.
This process imports the host once, freezes that heap (``gc.freeze``: no collector writes to it, so its pages stay
shared copy-on-write) and forks each instance from it. It never holds a tenant secret: the driver hands it three
descriptors it does not read (the instance's environment, its log, the lifeline of its sandbox) and the pid of the
sandbox's placeholder; the environment is read by the child, after the fork.

The child takes every isolation property from that placeholder, which the driver started exactly as it starts an
exec'd instance (cgroup, bubblewrap, ``prlimit``, ``setpriv``) but running a shell that waits on the lifeline. So the
sandbox is built by the same code in both modes; the child copies it (``sandbox_enter``): the placeholder's
cgroups, rlimits, cgroup/IPC/UTS/network/PID/mount namespaces, root and working directory, then a second fork (the
PID namespace applies to children only), a new session, no supplementary groups, the tenant's gid and uid, an
empty capability bounding set, ``no_new_privs``, and no descriptor but its standard streams and the lifeline.

What differs from an exec'd host, and is accepted (docs/security.md): every child shares this process's address
space layout (ASLR is chosen once, at the server's exec, like Android's zygote) and the pre-import heap.

No Django here and no control-plane import (the driver speaks to it over a root-only unix socket).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import gc
import json
import os
import resource
import signal
import socket
import sys
import traceback
from typing import Any

__all__ = ["serve", "sandbox_enter"]

_libc = ctypes.CDLL(None, use_errno=True)
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_PR_SET_MM = 35
_PR_SET_MM_MAP = 14
_PR_SET_CHILD_SUBREAPER = 36
# Entered in this order: the cgroup namespace after the cgroups (its root is the cgroup joined), the mount namespace
# last (after it, /proc and /sys are the sandbox's).
_NAMESPACES = ("cgroup", "ipc", "uts", "net", "pid", "mnt")
_HOST_ARGV = (sys.executable, "-m", "agent_runtime.host")
_MAX_FDS = 3  # environment, log, lifeline
_RETIRE_CHECK_S = 30.0
_SERVER_CWD = os.getcwd()
# The /proc "cmdline" and "environ" a child shows (kept alive: the kernel reads them from this memory).
_shown: list[Any] = []


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _prctl(option: int, arg: int = 0, arg3: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(arg3), 0, 0), f"prctl({option})")


def _setns(fd: int) -> None:
    _check(_libc.setns(fd, 0), "setns")


class _MmMap(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
        "arg_start", "arg_end", "env_start", "env_end", "auxv")] + [("auxv_size", ctypes.c_uint32),
                                                                 ("exe_fd", ctypes.c_uint32)]


def _show(argv: tuple[str, ...], env: dict[str, str]) -> None:
    """Make /proc/self/cmdline and environ what an exec'd host shows (the driver recognises its instances by them;
    without this they are the server's). ``PR_SET_MM_MAP``: the whole map at once, the kernel checks every address
    lies in this process's memory (the single-field ``PR_SET_MM`` needs CAP_SYS_RESOURCE, which a container lacks)."""
    regions = []
    for items in (list(argv), [f"{k}={v}" for k, v in env.items()]):
        raw = b"".join(item.encode() + b"\0" for item in items) or b"\0"
        buf = ctypes.create_string_buffer(raw, len(raw))
        _shown.append(buf)
        regions.append((ctypes.addressof(buf), ctypes.addressof(buf) + len(raw)))
    with open("/proc/self/stat") as fh:
        fields = [0, 0, 0, *map(int, fh.read().rsplit(")", 1)[1].split()[1:])]
    # /proc/<pid>/stat's 1-based field numbers: 26-28 code and stack, 45-47 data and heap start.
    _libc.sbrk.restype = ctypes.c_void_p
    mm = _MmMap(start_code=fields[26 - 1], end_code=fields[27 - 1], start_stack=fields[28 - 1],
                start_data=fields[45 - 1], end_data=fields[46 - 1], start_brk=fields[47 - 1],
                brk=_libc.sbrk(0), arg_start=regions[0][0], arg_end=regions[0][1], env_start=regions[1][0],
                env_end=regions[1][1], auxv=0, auxv_size=0, exe_fd=0xFFFFFFFF)
    _check(_libc.prctl(_PR_SET_MM, ctypes.c_ulong(_PR_SET_MM_MAP), ctypes.byref(mm),
                       ctypes.c_ulong(ctypes.sizeof(mm)), 0), "prctl(PR_SET_MM_MAP)")


def _last_cap() -> int:
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        return int(fh.read())


# /proc/<pid>/limits' row names (prlimit(2) on another process needs CAP_SYS_RESOURCE; the file does not).
_LIMIT_ROWS = {"Max cpu time": resource.RLIMIT_CPU, "Max file size": resource.RLIMIT_FSIZE,
               "Max data size": resource.RLIMIT_DATA, "Max stack size": resource.RLIMIT_STACK,
               "Max core file size": resource.RLIMIT_CORE, "Max resident set": resource.RLIMIT_RSS,
               "Max processes": resource.RLIMIT_NPROC, "Max open files": resource.RLIMIT_NOFILE,
               "Max locked memory": resource.RLIMIT_MEMLOCK, "Max address space": resource.RLIMIT_AS,
               "Max file locks": 10,  # RLIMIT_LOCKS (not in the resource module)
               "Max pending signals": resource.RLIMIT_SIGPENDING,
               "Max msgqueue size": resource.RLIMIT_MSGQUEUE, "Max nice priority": resource.RLIMIT_NICE,
               "Max realtime priority": resource.RLIMIT_RTPRIO, "Max realtime timeout": resource.RLIMIT_RTTIME}


def _limits(pid: int) -> dict[int, tuple[int, int]]:
    """Every rlimit of process ``pid`` (soft, hard); all of them or OSError."""
    found: dict[int, tuple[int, int]] = {}
    with open(f"/proc/{pid}/limits") as fh:
        for row in fh.read().splitlines()[1:]:
            name, values = row[:26].strip(), row[26:].split()
            if name in _LIMIT_ROWS:
                soft, hard = (resource.RLIM_INFINITY if v == "unlimited" else int(v) for v in values[:2])
                found[_LIMIT_ROWS[name]] = (soft, hard)
    if len(found) != len(_LIMIT_ROWS):
        raise OSError(f"could not read every rlimit of {pid}")
    return found


def sandbox_enter(placeholder: int, uid: int, gid: int, cgroups: list[str]) -> None:
    """Become a process of the placeholder's sandbox (everything but the PID namespace, which the next fork enters).
    Runs in the forked child, as root; raises OSError where a step fails (the child then exits, never half-entered)."""
    status = open(f"/proc/{placeholder}/status").read()
    ids = {line.split(":")[0]: line.split()[1:] for line in status.splitlines() if line.startswith(("Uid", "Gid"))}
    if ids.get("Uid", [""])[0] != str(uid) or ids.get("Gid", [""])[0] != str(gid):
        raise OSError(f"the placeholder {placeholder} does not run as the tenant's uid {uid}")
    ns_fds = [os.open(f"/proc/{placeholder}/ns/{name}", os.O_RDONLY) for name in _NAMESPACES]
    root_fd = os.open(f"/proc/{placeholder}/root", os.O_RDONLY | os.O_DIRECTORY)
    cwd_fd = os.open(f"/proc/{placeholder}/cwd", os.O_RDONLY | os.O_DIRECTORY)
    for directory in cgroups:
        with open(os.path.join(directory, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    for limit, values in _limits(placeholder).items():
        resource.setrlimit(limit, values)
    for fd in ns_fds:
        _setns(fd)
        os.close(fd)
    os.fchdir(root_fd)
    os.chroot(".")
    os.fchdir(cwd_fd)
    os.close(root_fd)
    os.close(cwd_fd)


def _drop_privileges(uid: int, gid: int) -> None:
    """What ``setpriv --reuid --regid --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs`` does."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    for cap in range(_last_cap() + 1):
        _prctl(_PR_CAPBSET_DROP, cap)
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    os.setresuid(uid, uid, uid)  # all three non-zero: the kernel clears the permitted and effective sets
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    # setuid made the process non-dumpable; an exec'd host is dumpable (its own uid may read its /proc), so is this.
    _prctl(_PR_SET_DUMPABLE, 1)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _host(env_fd: int, log_fd: int, lifeline_fd: int, uid: int, gid: int) -> None:
    """The grandchild, inside the PID namespace: its streams, its environment, its identity, then the host."""
    env = json.loads(_read_all(env_fd))
    os.setsid()
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.dup2(lifeline_fd, 3)  # held open for life: its close (our exit, any way) ends the placeholder and the sandbox
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))
    os.set_inheritable(3, False)
    _show(_HOST_ARGV, env)
    _drop_privileges(uid, gid)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.argv = list(_HOST_ARGV[2:])
    # ``-m`` put the server's working directory first on the path; an exec'd host has its own (its volume's parent).
    if sys.path and sys.path[0] == _SERVER_CWD:
        sys.path[0] = os.getcwd()
    # The server's heap stays frozen: a collection that walked it would write to every object's header and copy
    # the shared pages into this child.
    from agent_runtime.host import main

    os._exit(main())


def _launch(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """The first child: enter the sandbox, fork the host into its PID namespace, tell the driver the host's pid
    (as the machine sees it) and exit."""
    env_fd, log_fd, lifeline_fd = fds
    uid, gid = int(request["uid"]), int(request["gid"])
    try:
        sandbox_enter(int(request["placeholder"]), uid, gid, [str(c) for c in request["cgroups"]])
        pid = os.fork()
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, then the child exits
        conn.sendall(json.dumps({"error": f"{exc.__class__.__name__}: {exc}"}).encode() + b"\n")
        os._exit(1)
    if pid == 0:
        try:
            conn.close()
            _host(env_fd, log_fd, lifeline_fd, uid, gid)
        except BaseException:  # noqa: BLE001 - into the instance's log (its stderr by then), never into the server
            traceback.print_exc()
        finally:
            os._exit(70)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    os._exit(0)


def _serve_one(conn: socket.socket) -> None:
    msg, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_LEN(_MAX_FDS * 4))
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    try:
        if len(fds) != _MAX_FDS:
            conn.sendall(b'{"error": "expected three descriptors: environment, log, lifeline"}\n')
            return
        request = json.loads(msg)
        child = os.fork()
        if child == 0:
            _launch(conn, request, list(fds))
        with contextlib.suppress(ChildProcessError):  # reaped by _reap already
            os.waitpid(child, 0)  # it exits as soon as the host is forked
    finally:
        for fd in fds:
            os.close(fd)


def _reap(_signum: int, _frame: object) -> None:
    """Collect every exited child (hosts, first forks): none is left a zombie holding a pid."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _retired(path: str, own: int) -> bool:
    """Whether our socket is gone or another's (the driver started a server for newer code)."""
    try:
        return os.stat(path).st_ino != own
    except FileNotFoundError:
        return True


def _children() -> bool:
    with open(f"/proc/self/task/{os.getpid()}/children") as fh:
        return bool(fh.read().strip())


def serve(path: str, retire_check_s: float = _RETIRE_CHECK_S) -> None:
    """Accept launch requests on the unix socket ``path`` (mode 0700, in a 0700 directory: root's only) until killed,
    or until the socket is gone or replaced (another runtime's server took over) and no instance of ours is left."""
    # The point of the server: the runtime and its libraries imported once, shared by every child. The runtime
    # only: an agent (a release) is a tenant's code and is imported by its own host, after the fork.
    import concurrent.futures.thread  # noqa: F401 - opentelemetry's resource detection, at every host's start

    import agent_runtime.host.cli  # noqa: F401
    import agent_runtime.host.process  # noqa: F401
    import agent_runtime.host.tracing  # noqa: F401

    # The hosts' parent once their first fork exits (the kernel would give them to the machine's init, which in a
    # container may never reap them): this process reaps them as they exit.
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGCHLD, _reap)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    listener.bind(path)
    os.umask(old)
    # Our socket's inode, taken before anyone is told we are ready: once we are, the driver may retire us (unlink
    # the socket) at once, and a stat after that would find nothing. Gone already: retired before we began (-1
    # matches no inode, so the first retire check says so).
    try:
        own = os.stat(path).st_ino
    except FileNotFoundError:
        own = -1
    listener.listen(64)
    gc.collect()
    gc.freeze()
    print(json.dumps({"event": "forkserver_ready", "pid": os.getpid(), "socket": path}), flush=True)
    listener.settimeout(retire_check_s)
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if _retired(path, own) and not _children():
                return  # another runtime's server serves new instances, and none of ours is left to reap
            continue
        conn.settimeout(None)
        with conn:
            try:
                _serve_one(conn)
            except (OSError, ValueError) as exc:
                print(json.dumps({"event": "forkserver_request_failed", "error": str(exc)}), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1], *(float(a) for a in sys.argv[2:3]))
