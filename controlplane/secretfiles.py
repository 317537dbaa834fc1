"""Generated secrets kept in files, created exactly once even when several processes race for them.

The embedded default generates its development secrets (Django's secret key, the vault's key
ring, the demo's credentials) on first use, and the first use can happen in the web server, a
worker, beat and a management command at the same instant. Check-then-write lets each of them
generate its own value and overwrite the others; a process that lost then keeps using a key that
exists nowhere else. Here a value is written to a private temporary file, fsynced, and published
with ``os.link``, which fails if the name exists: the first link wins, nothing ever replaces an
existing file, and every process - winner or loser - returns what is on disk.

A plain module: no Django import, so ``settings.py`` can use it before Django is configured.
It does not decide where secrets live or what they look like; callers pass the path and the
generator (``DEV_SECRETS`` lists the development ones).
"""

from __future__ import annotations

import base64
import os
import secrets
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "SecretFileError", "read_or_create_secret", "DEV_SECRETS", "DEV_SECRET_KEY_FILE", "DEV_KEYRING_FILE",
    "DEV_PG_SUPERUSER_PASSWORD_FILE",
    "dev_secret_path", "dev_secret", "dev_secrets_ensure", "last_outcome",
]

FILE_MODE = 0o600
DIR_MODE = 0o700

# What happened the last time this process asked for a path: "existing" (read what was there),
# "created" (this process's link won) or "lost-race" (another process linked first; its value
# is used). For start-up messages and the first-boot tests; nothing depends on it.
last_outcome: dict[str, str] = {}


class SecretFileError(RuntimeError):
    """A secret file exists but cannot be used (empty); it is never replaced automatically."""


def _read(path: Path) -> str | None:
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        return None
    if not value:
        # Only a writer that bypassed this module (or a disk that lost the data) leaves an empty
        # file: published files are complete before their name exists. Replacing it could fork
        # the secret between processes, so a person decides.
        raise SecretFileError(f"{path} exists but is empty: remove it only if nothing was encrypted with it")
    return value


def _private_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    if stat.S_IMODE(directory.stat().st_mode) & 0o077:
        os.chmod(directory, DIR_MODE)  # an existing directory keeps its mode otherwise


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_or_create_secret(path: Path | str, generate: Callable[[], str]) -> str:
    """The secret stored at ``path``; if there is none, ``generate()`` one and publish it atomically.

    Safe to call from any number of processes at once: all of them return the same value, the
    one whose link landed first. The file is 0600 in a 0700 directory. ``generate`` may run in
    a process whose value then loses the race and is discarded, so it must have no lasting
    effect beyond producing the value.
    """
    path = Path(path)
    value = _read(path)
    if value is not None:
        last_outcome[str(path)] = "existing"
        return value
    _private_dir(path.parent)
    generated = generate().strip()
    if not generated:
        raise SecretFileError(f"the generator for {path.name} produced an empty value")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(generated + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
            outcome = "created"
        except FileExistsError:
            outcome = "lost-race"
    finally:
        os.unlink(tmp)
    if outcome == "created":
        _fsync_dir(path.parent)  # the name itself survives a crash, not only the bytes
    last_outcome[str(path)] = outcome
    value = _read(path)
    if value is None:
        raise SecretFileError(f"{path} disappeared right after it was created")
    return value


# --- the development secrets of the embedded default (production sets them in the environment) ----

DEV_SECRET_KEY_FILE = "django-secret-key"
DEV_KEYRING_FILE = "vault-keyring"
# The embedded PostgreSQL's superuser password (controlplane.embedded_pg): every role logs in with SCRAM.
DEV_PG_SUPERUSER_PASSWORD_FILE = "postgres-superuser-password"


def _new_keyring() -> str:
    # The vault's key-ring format (vault.kek.parse_keyring): one version, a random 256-bit key.
    return "v1:" + base64.b64encode(os.urandom(32)).decode()


DEV_SECRETS: dict[str, Callable[[], str]] = {
    DEV_SECRET_KEY_FILE: lambda: secrets.token_urlsafe(50),
    DEV_KEYRING_FILE: _new_keyring,
    DEV_PG_SUPERUSER_PASSWORD_FILE: lambda: secrets.token_urlsafe(32),
}


def dev_secret_path(var_dir: Path, name: str) -> Path:
    return Path(var_dir) / "secrets" / name


def dev_secret(var_dir: Path, name: str) -> str:
    """A development secret under ``var_dir/secrets``, generated once per var directory."""
    return read_or_create_secret(dev_secret_path(var_dir, name), DEV_SECRETS[name])


def dev_secrets_ensure(var_dir: Path, names: tuple[str, ...] = tuple(DEV_SECRETS)) -> dict[str, str]:
    """Create the named development secrets before any process starts; returns {name: outcome}."""
    outcomes = {}
    for name in names:
        dev_secret(var_dir, name)
        outcomes[name] = last_outcome[str(dev_secret_path(var_dir, name))]
    return outcomes
