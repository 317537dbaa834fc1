"""A private dovecot IMAP server (Debian's `dovecot-imapd`) for tests: one user, one Maildir, loopback only.

`start_dovecot(name)` writes a configuration of its own (no /etc/dovecot), with its base_dir, state_dir and
log under a fresh directory in /tmp, and runs `dovecot -F -c <that file>` listening on two ephemeral loopback
ports: `port` (IMAP, STARTTLS offered, plaintext login allowed) and `tls_port` (IMAPS), with a self-signed
certificate for 127.0.0.1 (`cafile` verifies it). The one user (`user`, a generated `password`) comes from a
passwd-file, its mail is `maildir` (Maildir++: the folder "Sent" is `maildir/.Sent`, created empty), so a
relay that files its copies there (the smtp peer's AGENT_SMTP_SINK_MAILDIR) is what IMAP shows.

Started as root, dovecot's own processes run as Debian's `dovecot`/`dovenull` users and the mail processes as
`mail` (dovecot refuses uid 0 for mail access), so the directory is world-traversable and the Maildir belongs
to `mail`; as another user, everything runs as that user. A server that does not come up (no binary, a
configuration error, no IMAP greeting) fails the test with dovecot's log: never a skip.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controlplane.ports import free_port

__all__ = ["Dovecot", "start_dovecot"]

DOVECOT = "/usr/sbin/dovecot"


@dataclass
class Dovecot:
    workdir: Path
    port: int
    tls_port: int
    user: str
    password: str = field(repr=False)
    cafile: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def maildir(self) -> Path:
        return self.workdir / "home" / "Maildir"

    def folder(self, mailbox: str) -> Path:
        """The Maildir++ directory of `mailbox` (what a relay files into for dovecot to show it)."""
        return self.maildir / f".{mailbox}"

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in (self.workdir / "stdout.log",
                                                                 self.workdir / "dovecot.log") if p.exists())

    def stop(self) -> None:
        # SIGTERM: the master stops its children (a SIGKILL would leave them running); the group is the fallback.
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _accounts() -> tuple[str, str, pwd.struct_passwd]:
    """(internal user, login user, mail user) for the configuration."""
    if os.geteuid() == 0:
        return "dovecot", "dovenull", pwd.getpwnam("mail")
    me = pwd.getpwuid(os.geteuid())
    return me.pw_name, me.pw_name, me


def _self_signed(workdir: Path) -> tuple[Path, Path]:
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    out = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                          "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                          "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        pytest.fail(f"openssl could not make the test certificate:\n{out.stderr}")
    return cert, key


def _config(workdir: Path, port: int, tls_port: int, cert: Path, key: Path, internal: str, login: str) -> str:
    return f"""\
protocols = imap
listen = 127.0.0.1
instance_name = {workdir.name}
base_dir = {workdir}/run
state_dir = {workdir}/state
log_path = {workdir}/dovecot.log
ssl = yes
ssl_cert = <{cert}
ssl_key = <{key}
disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = {internal}
default_internal_group = {internal}
default_login_user = {login}
first_valid_uid = 1
mail_location = maildir:~/Maildir
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {workdir}/passwd
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {workdir}/passwd
}}
# A wrong-password test must not slow down every later login from 127.0.0.1 (anvil's penalty doubles up to 15 s).
auth_failure_delay = 0
service anvil {{
  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {tls_port}
    ssl = yes
  }}
}}
"""


def _greeted(port: int, cafile: Path | None = None) -> bool:
    """The server's IMAP greeting on `port` (over TLS, verified against `cafile`, when given)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as raw:
            s = ssl.create_default_context(cafile=str(cafile)).wrap_socket(raw, server_hostname="127.0.0.1") \
                if cafile is not None else raw
            s.settimeout(2)
            return s.recv(256).startswith(b"* OK")
    except OSError:
        return False


def start_dovecot(name: str = "", user: str = "agent", timeout_s: float = 15) -> Dovecot:
    """A running dovecot with one user whose Maildir holds an empty "Sent" folder; `stop()` at teardown."""
    if not Path(DOVECOT).exists():
        pytest.fail(f"{DOVECOT} is missing: install Debian's dovecot-imapd (make system-deps)")
    workdir = Path(tempfile.mkdtemp(prefix=f"dovecot-{name}-" if name else "dovecot-"))
    workdir.chmod(0o755)  # dovecot's unprivileged processes reach their sockets and the mail under it
    internal, login, mail = _accounts()
    home = workdir / "home"
    for sub in ("", "Maildir", "Maildir/.Sent", *(f"Maildir/.Sent/{d}" for d in ("cur", "new", "tmp"))):
        (home / sub).mkdir(mode=0o700, exist_ok=True)
        os.chown(home / sub, mail.pw_uid, mail.pw_gid)
    password = secrets.token_urlsafe(18)
    passwd = workdir / "passwd"
    passwd.write_text(f"{user}:{{PLAIN}}{password}:{mail.pw_uid}:{mail.pw_gid}::{home}::\n")
    passwd.chmod(0o640)
    os.chown(passwd, 0 if os.geteuid() == 0 else -1, pwd.getpwnam(internal).pw_gid)  # read by the auth process
    cert, key = _self_signed(workdir)
    port, tls_port = free_port(), free_port()
    (workdir / "dovecot.conf").write_text(_config(workdir, port, tls_port, cert, key, internal, login))
    server = Dovecot(workdir=workdir, port=port, tls_port=tls_port, user=user, password=password, cafile=cert)
    with (workdir / "stdout.log").open("ab") as out:
        server.proc = subprocess.Popen([DOVECOT, "-F", "-c", str(workdir / "dovecot.conf")], stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
    # The port accepting is not enough: imap-login is started on the first connection and may die there
    # (a user it refuses, a certificate it cannot read); the IMAP greeting on both ports is.
    deadline = time.monotonic() + timeout_s
    while not (_greeted(port) and _greeted(tls_port, cert)):
        if server.proc.poll() is not None or time.monotonic() > deadline:
            why = (f"exited with {server.proc.returncode}" if server.proc.returncode is not None
                   else f"gave no IMAP greeting within {timeout_s:g} s")
            log = server.log()
            server.stop()
            pytest.fail(f"dovecot did not start ({why}); its log:\n{log[-4000:]}")
        time.sleep(0.05)
    return server
