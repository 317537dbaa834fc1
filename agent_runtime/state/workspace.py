"""Working files: a deterministic Merkle digest of a directory, and encrypted snapshots of it.

The digest covers relative paths, the kind of every entry, permission bits and contents (symlinks by
target, FIFOs and sockets by kind), never mtimes or owners, so the same tree always has the same digest.
What a judgment depends on must be inside the tree: a symlink that leaves the workspace (absolute, or
resolving outside it) and device nodes are refused (`WorkspaceRefused`), because their contents can change
without changing the digest. A restore unpacks into a sibling directory, checks
the digest against the snapshot record and only then swaps it in: a bad or missing snapshot leaves the
current workspace untouched. A restore holds `workspace_lock` on the directory it replaces, and so does
whoever must act on the files exactly as they were judged (an effect guarded by a judgment): the two never
interleave.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from agent_runtime.errors import CorruptState, SnapshotMissing, WorkspaceRefused
from agent_runtime.state.objectstore import ObjectStore

__all__ = ["EMPTY_DIGEST", "restore_snapshot", "snapshot", "tree_digest", "workspace_lock"]


def _h(*parts: bytes) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.digest()


def _node(path: Path, rel: str, root: Path) -> bytes:
    st = path.lstat()
    mode = str(stat.S_IMODE(st.st_mode)).encode()
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        resolved = (path.parent / target).resolve()
        if os.path.isabs(target) or not (resolved == root or resolved.is_relative_to(root)):
            raise WorkspaceRefused(f"workspace entry {rel!r} is a symlink to {target!r}, outside the workspace: "
                                   "its contents could change without changing the digest")
        return _h(b"l", rel.encode(), target.encode())
    if stat.S_ISDIR(st.st_mode):
        children = sorted(os.listdir(path))
        return _h(b"d", rel.encode(), mode, *(_node(path / c, f"{rel}/{c}" if rel else c, root) for c in children))
    if stat.S_ISREG(st.st_mode):
        fh = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                fh.update(chunk)
        return _h(b"f", rel.encode(), mode, fh.digest())
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        raise WorkspaceRefused(f"workspace entry {rel!r} is a device node; refusing to digest it")
    kind = b"p" if stat.S_ISFIFO(st.st_mode) else b"s" if stat.S_ISSOCK(st.st_mode) else b"o"
    return _h(kind, rel.encode(), mode)


def tree_digest(root: Path) -> str:
    """Merkle digest of `root` (a missing directory digests like an empty one)."""
    if not root.exists():
        return EMPTY_DIGEST
    real = root.resolve()
    children = sorted(os.listdir(root))
    return _h(b"root", *(_node(root / c, c, real) for c in children)).hex()


EMPTY_DIGEST = _h(b"root").hex()


def _tar_bytes(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        if root.exists():
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames.sort()
                for name in sorted(dirnames) + sorted(filenames):
                    full = Path(dirpath, name)
                    info = tar.gettarinfo(str(full), arcname=full.relative_to(root).as_posix())
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.mtime = 0
                    if info.isfile():
                        with full.open("rb") as fh:
                            tar.addfile(info, fh)
                    else:
                        tar.addfile(info)
    return buf.getvalue()


def snapshot(conn: psycopg.Connection, store: ObjectStore, root: Path, scope: str) -> tuple[str, str]:
    """Upload an (encrypted, via `store`) tarball of `root`; record it; return (object key, digest)."""
    digest = tree_digest(root)
    key = f"snapshots/{scope}/{digest}.tar.gz"
    if not store.exists(key):
        store.put(key, _tar_bytes(root))
    conn.execute("INSERT INTO snapshots (scope, object_key, digest) VALUES (%s, %s, %s)", (scope, key, digest))
    return key, digest


@contextmanager
def workspace_lock(root: Path) -> Iterator[None]:
    """Hold off any `restore_snapshot` of `root` (across threads and processes) while the block runs.

    The lock is an flock on `root`'s parent directory: `root` itself is swapped by a restore, and a lock file
    would be an entry some digest could see.
    """
    root.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def restore_snapshot(store: ObjectStore, key: str, root: Path, expected_digest: str) -> None:
    """Replace `root` with the snapshot at `key`, refusing anything whose digest does not match."""
    blob = store.get(key)  # SnapshotMissing propagates with the key in the message
    with workspace_lock(root):
        _restore_locked(blob, key, root, expected_digest)


def _restore_locked(blob: bytes, key: str, root: Path, expected_digest: str) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".restore-", dir=root.parent))
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
                tar.extractall(staging, filter="data")  # refuses absolute paths, '..' and devices
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise CorruptState(f"snapshot {key!r} is unreadable: {exc}") from exc
        for dirpath, _dirs, files in os.walk(staging):
            for name in files:  # tar 'data' filter may tweak modes; restore exact recorded bits
                Path(dirpath, name).chmod(Path(dirpath, name).stat().st_mode & 0o7777)
        got = tree_digest(staging)
        if got != expected_digest:
            raise CorruptState(f"snapshot {key!r} restores to digest {got[:12]}, expected {expected_digest[:12]}")
        old = root.with_name(root.name + ".old-restore")
        if root.exists():
            os.replace(root, old)
        os.replace(staging, root)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def latest_snapshot(conn: psycopg.Connection, scope: str) -> tuple[str, str]:
    row = conn.execute(
        "SELECT object_key, digest FROM snapshots WHERE scope = %s ORDER BY id DESC LIMIT 1", (scope,)
    ).fetchone()
    if row is None:
        raise SnapshotMissing(f"no snapshot recorded for scope {scope!r}")
    return row[0], row[1]
