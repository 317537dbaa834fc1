"""Object-store contract (`ObjectStore` Protocol), the filesystem implementation and encryption wrapper.

Keys are relative names under the tenant prefix the URL already points at; a key that would leave it
(absolute, `..`, backslashes, empty parts) is refused. An S3 implementation plugs in behind the same
Protocol via `objectstore_from_url`.

Besides whole objects (`put`/`get`), a store keeps record objects (`append`/`records`, format in
`agent_runtime.state.records`): the effect journal appends an effect's outcome to the object holding its intent.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import unquote, urlparse

from agent_runtime.crypto import open_sealed, seal
from agent_runtime.errors import ConfigError, CorruptState, ObjectKeyRefused, SnapshotMissing
from agent_runtime.state.records import Records, frame, is_record_object, parse_records, record_object

__all__ = ["EncryptedObjectStore", "FileObjectStore", "ObjectStore", "check_key", "objectstore_from_url"]


@runtime_checkable
class ObjectStore(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes:
        """Return the object's bytes; raise `SnapshotMissing` when absent."""
        ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def exists(self, key: str) -> bool: ...

    def append(self, key: str, record: bytes) -> None:
        """Make `record` the last record of record object `key` (created when absent); durable once it returns.

        Readers use the last record. A store that cannot append in place, or an object written whole, is put
        whole again with `record` alone: earlier records are history, which a whole `put` never kept either."""
        ...

    def records(self, key: str) -> Records:
        """The records of `key`, oldest first (an object written whole is one record); raise `SnapshotMissing`
        when absent."""
        ...

    def create(self, key: str, record: bytes) -> bool:
        """Make `record` the one record of a new record object `key`, durable once it returns True; return False,
        writing nothing, when `key` exists already (another writer's object is never replaced)."""
        ...


def check_key(key: str) -> str:
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ObjectKeyRefused(f"object key {key!r} refused: must be a relative name under the prefix")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ObjectKeyRefused(f"object key {key!r} refused: empty, '.' or '..' segment")
    return key


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 16, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _durable_temp(directory: Path, data: bytes) -> str:
    """A new temporary file in `directory` holding `data`, fsynced; its path (the caller renames or links it)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileObjectStore:
    """Objects as files below a root directory; writes are atomic and durable (temp file, fsync, rename, fsync of
    the directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, key: str) -> Path:
        """The file of `key`, below the root and reached through no symbolic link.

        `check_key` has refused every name that leaves the root by its letters ('..', absolute); what is left is a
        link planted below the root, which could point anywhere. The root was resolved once; each component
        below it that exists is looked at without following it (one `lstat` each, where resolving the whole path
        on every call cost one per component from `/`, on the durable step's path three times an effect).
        """
        path = str(self.root)
        for part in check_key(key).split("/"):
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                break  # nothing below a missing component exists yet: the write makes plain directories
            if stat.S_ISLNK(mode):
                raise ObjectKeyRefused(f"object key {key!r} refused: it goes through a symbolic link")
        return Path(self.root, key)

    def put(self, key: str, data: bytes) -> None:
        """Durable once it returns: the data is fsynced before the rename, and the directory after it.

        A rename lives in its directory: until the directory itself is fsynced, a power loss can leave the old
        entry (or none) even though the file's data reached the disk. The same holds for a directory this put
        created, which lives in its parent's entries.
        """
        path = self._path(key)
        created = self._make_parents(path)
        tmp = _durable_temp(path.parent, data)
        try:
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        for directory in (path.parent, *(d.parent for d in created)):
            _fsync_dir(directory)

    def append(self, key: str, record: bytes) -> None:
        """Durable once it returns, at the cost of one `fdatasync` when the object exists already.

        The object's directory entry was made durable by the `put` that created it (data fsynced, renamed, the
        directory fsynced), and an append in place changes no directory: `fdatasync` flushes the new bytes and
        the file's size, which is all it takes to read them back after a power loss. A torn append (one that
        never returned) reads as absent (`parse_records`) and is cut off before the next append, so that it never
        ends up between records. An object that is new, or was written whole, is (re)written whole by `put` with
        `record` alone, durably and atomically.
        """
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            self.put(key, record_object([record]))
            return
        try:
            raw = _read_all(fd)
            if is_record_object(raw):
                end = parse_records(key, raw).end
                if end < len(raw):
                    os.ftruncate(fd, end)  # a torn append's bytes; the fdatasync below makes the cut durable too
                data = memoryview(frame(record))
                while data:
                    data = data[os.write(fd, data):]
                os.fdatasync(fd)
                return
        finally:
            os.close(fd)
        self.put(key, record_object([record]))

    def records(self, key: str) -> Records:
        return parse_records(key, self.get(key)).records

    def create(self, key: str, record: bytes) -> bool:
        """`put`, but exclusive: the whole, fsynced temporary file is hard-linked to the object's name, which fails
        when the name exists (an atomic test-and-create, where the rename of `put` would replace the object)."""
        path = self._path(key)
        created = self._make_parents(path)
        tmp = _durable_temp(path.parent, record_object([record]))
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        for directory in (path.parent, *(d.parent for d in created)):
            _fsync_dir(directory)
        return True

    def _make_parents(self, path: Path) -> list[Path]:
        """Make `path`'s missing parent directories below the root; return the ones made (each lives in its
        parent's entries, so a durable write fsyncs those parents too)."""
        if path.parent == self.root or os.path.isdir(path.parent):  # the common case: one stat
            return []
        created = [d for d in (path.parent, *path.parent.parents) if d != self.root and self.root in d.parents
                   and not d.exists()]
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return created

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise SnapshotMissing(f"object {key!r} is missing from the object store") from exc

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        def walk() -> Iterator[str]:
            for dirpath, _dirs, files in os.walk(self.root):
                for name in files:
                    if name.startswith(".tmp-"):
                        continue
                    yield Path(dirpath, name).relative_to(self.root).as_posix()

        return sorted(k for k in walk() if k.startswith(prefix))


class EncryptedObjectStore:
    """Wraps any ObjectStore: every object sealed with the tenant data key, AAD = (tenant, key name)."""

    def __init__(self, inner: ObjectStore, data_key: bytes, tenant_id: str,
                 previous_keys: tuple[bytes, ...] = ()) -> None:
        self.inner = inner
        self._data_key = data_key
        # Older object-key versions (after a rotation): read-only fallbacks, never used to write.
        self._previous_keys = previous_keys
        self.tenant_id = tenant_id

    def put(self, key: str, data: bytes) -> None:
        self.inner.put(check_key(key), seal(self._data_key, self.tenant_id, key, data))

    def get(self, key: str) -> bytes:
        return self._open(key, self.inner.get(check_key(key)))

    def _open(self, key: str, blob: bytes) -> bytes:
        try:
            return open_sealed(self._data_key, self.tenant_id, key, blob)
        except CorruptState:
            for older in self._previous_keys:
                try:
                    return open_sealed(older, self.tenant_id, key, blob)
                except CorruptState:
                    continue
            raise

    def append(self, key: str, record: bytes) -> None:
        # Each record is sealed on its own under the object's name, like a whole object: an object written whole
        # (an older journal entry) is then its own first record, and a record moved to another object or tenant
        # fails to open.
        self.inner.append(check_key(key), seal(self._data_key, self.tenant_id, key, record))

    def create(self, key: str, record: bytes) -> bool:
        return self.inner.create(check_key(key), seal(self._data_key, self.tenant_id, key, record))

    def records(self, key: str) -> Records:
        """The opened records of `key`. A torn last append was dropped below (its CRC, its length); a record that
        is whole but fails authentication was changed or moved, which is corruption."""
        return [self._open(key, blob) for blob in self.inner.records(check_key(key))]

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)


def objectstore_from_url(url: str) -> ObjectStore:
    """Build the (unencrypted) store for `AGENT_OBJECTSTORE_URL`; dispatches on scheme."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigError(f"file object-store URL must be file:///abs/path/, got {url!r}")
        path = unquote(parsed.path)
        if not path.startswith("/"):
            raise ConfigError(f"file object-store URL needs an absolute path, got {url!r}")
        return FileObjectStore(Path(path))
    if parsed.scheme == "s3":
        from agent_runtime.state.objectstore_s3 import S3ObjectStore

        return S3ObjectStore.from_url(url)
    raise ConfigError(f"unsupported object-store URL scheme {parsed.scheme!r} in {url!r}: use file:// or s3://")
