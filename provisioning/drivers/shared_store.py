"""The control plane's own object store: what every machine of the control plane must read, whichever wrote it.

Today that is release wheels, content-addressed by their digest (``releases/store.py``); a machine's ``var/`` only
caches what is derived from them. Two implementations behind one ``SharedStore`` contract, chosen by
``CONTROLPLANE_OBJECTSTORE``, each reusing its tenant object store's place and client:

- ``local``: files under ``LOCAL_OBJECTSTORE_ROOT/controlplane/`` (hidden from instances like the rest of that
  root); shared only as far as that directory is (one machine: the embedded default, ``make demo``);
- ``s3``: keys under ``controlplane/`` in ``S3_BUCKET``, outside every ``tenants/<id>/`` prefix (so no tenant's
  vended credentials reach them); the one choice production accepts (``controlplane/security.py``).

Writes are whole and atomic (a rename, a single PUT): a reader never sees half an object. Nothing here knows
what an object means; digests are checked by the caller.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from django.conf import settings

from controlplane.errors import ProvisioningError

__all__ = ["PREFIX", "LocalSharedStore", "S3SharedStore", "SharedObjectMissing", "SharedStore", "shared_key",
           "shared_store"]

PREFIX = "controlplane/"


class SharedObjectMissing(ProvisioningError):
    """The object is not in the store."""


def shared_key(key: str) -> str:
    """``key`` as a relative name below the store's prefix; anything that could leave it is refused."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\\" in key or "\x00" in key or any(p in ("", ".", "..") for p in parts):
        raise ProvisioningError(f"object key {key!r} refused: must be a relative name under {PREFIX}")
    return key


@runtime_checkable
class SharedStore(Protocol):
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` whole under ``key`` (replacing what was there); durable once it returns."""
        ...

    def get(self, key: str) -> bytes:
        """The stored bytes; ``SharedObjectMissing`` when absent, ``ProvisioningError`` when unreadable."""
        ...

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove the object; one already gone is not an error."""
        ...

    def url(self, key: str) -> str:
        """Where the object is, for an operator's eyes (``s3://bucket/controlplane/...``, or its path)."""
        ...


class LocalSharedStore:
    """Objects as files under ``<LOCAL_OBJECTSTORE_ROOT>/controlplane/``, written by rename after an fsync."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or Path(settings.LOCAL_OBJECTSTORE_ROOT)) / PREFIX.rstrip("/")

    def _path(self, key: str) -> Path:
        return self.root / shared_key(key)

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise SharedObjectMissing(f"{self.url(key)} is missing") from None
        except OSError as exc:
            raise ProvisioningError(f"{self.url(key)} is not readable: {exc.strerror}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def url(self, key: str) -> str:
        return str(self._path(key))  # a host path: scrubbed to objectstore://<key> wherever it is shown


class S3SharedStore:
    """Objects as keys ``controlplane/<key>`` in ``S3_BUCKET`` (the tenants' bucket, outside their prefixes)."""

    def __init__(self) -> None:
        from .s3_objectstore import bucket_ensure, s3_bucket, s3_client

        self.bucket, self.client = s3_bucket(), s3_client()
        self._bucket_ensure = bucket_ensure

    def put(self, key: str, data: bytes) -> None:
        self._bucket_ensure(self.client, self.bucket)
        self.client.put_object(Bucket=self.bucket, Key=PREFIX + shared_key(key), Body=data)

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            answer: Any = self.client.get_object(Bucket=self.bucket, Key=PREFIX + shared_key(key))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                raise SharedObjectMissing(f"{self.url(key)} is missing") from None
            raise ProvisioningError(f"{self.url(key)} is not readable: S3 answered {code or exc}") from None
        body: bytes = answer["Body"].read()
        return body

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=PREFIX + shared_key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=PREFIX + shared_key(key))

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{PREFIX}{shared_key(key)}"


def shared_store() -> SharedStore:
    """The store ``CONTROLPLANE_OBJECTSTORE`` names."""
    if settings.CONTROLPLANE_OBJECTSTORE == "s3":
        return S3SharedStore()
    return LocalSharedStore()
