"""`ObjectStore` on S3 (any S3-compatible endpoint) for the tenant prefix an `s3://bucket/tenants/<id>/` URL names.

Keys are relative names under that prefix, checked with the same `check_key` as the filesystem
store; the full S3 key is built here and verified to still start with the prefix, so nothing is
ever read, written, listed or deleted outside it. This class stores bytes as given: the host wraps
it in `EncryptedObjectStore` (AES-256-GCM with the tenant key, AAD = tenant + key name), exactly as
it wraps `FileObjectStore`, so a listing of another prefix yields only ciphertext.

Credentials and endpoint come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_CREDENTIAL_EXPIRATION, AWS_REGION, AWS_ENDPOINT_URL_S3), which the control
plane's kubernetes profile puts into the instance's Secret. Session credentials (with an expiration)
are the first of a renewing set: before they expire the client fetches fresh ones for this prefix
from the control plane (``s3_credentials``), so a running instance never restarts for them. Django-free.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Any
from urllib.parse import urlparse

from agent_runtime.errors import ConfigError, ObjectKeyRefused, SnapshotMissing
from agent_runtime.state.objectstore import EncryptedObjectStore, check_key
from agent_runtime.state.records import Records, parse_records, record_object

__all__ = ["S3ObjectStore", "encrypted_s3_store", "parse_s3_url"]

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_MISSING = {"404", "NoSuchKey", "NotFound"}
PREFIX_MARKER = ".tenant"  # written by the control plane when it creates the prefix; not a runtime object


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/tenants/<uuid>/` -> (bucket, "tenants/<uuid>/"); anything else is a ConfigError."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not _BUCKET.match(parsed.netloc or ""):
        raise ConfigError(f"object-store URL must be s3://<bucket>/tenants/<tenant-id>/, got {url!r}")
    prefix = parsed.path.lstrip("/")
    parts = prefix.split("/")
    if len(parts) != 3 or parts[0] != "tenants" or parts[2] != "" or parsed.query or parsed.fragment:
        raise ConfigError(f"object-store URL must name exactly one tenant prefix, got {url!r}")
    try:
        uuid.UUID(parts[1])
    except ValueError as exc:
        raise ConfigError(f"object-store URL names no tenant id: {url!r}") from exc
    return parsed.netloc, prefix


class S3ObjectStore:
    """Objects under one prefix of one bucket. Writes are single PUTs, so a reader sees all or nothing."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        if not prefix.endswith("/") or prefix.startswith("/"):
            raise ConfigError(f"S3 prefix {prefix!r} must be relative and end with '/'")
        self._s3 = client
        self.bucket = bucket
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, *, client: Any = None) -> S3ObjectStore:
        bucket, prefix = parse_s3_url(url)
        if client is None:
            from agent_runtime.state.s3_credentials import instance_s3_client

            client = instance_s3_client(os.environ, tenant_id=prefix.split("/")[1], prefix=prefix)
        return cls(client, bucket, prefix)

    def _key(self, key: str) -> str:
        full = self.prefix + check_key(key)
        if not full.startswith(self.prefix) or len(full) > 1024:
            raise ObjectKeyRefused(f"object key {key!r} refused: outside the tenant prefix or too long")
        return full

    def put(self, key: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def get(self, key: str) -> bytes:
        try:
            answer = self._s3.get_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if _error_code(exc) in _MISSING:
                raise SnapshotMissing(f"object {key!r} is missing from the object store") from exc
            raise
        body: bytes = answer["Body"].read()
        return body

    def append(self, key: str, record: bytes) -> None:
        """S3 has no append: the object is put whole with `record` alone (the last record is the one readers use;
        a PUT is durable when it returns), one PUT as before record objects, without reading it first."""
        self.put(key, record_object([record]))

    def create(self, key: str, record: bytes) -> bool:
        """A conditional PUT (`If-None-Match: *`): S3 refuses it with 412 when the object exists."""
        try:
            self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=record_object([record]), IfNoneMatch="*")
        except Exception as exc:
            if _error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def records(self, key: str) -> Records:
        return parse_records(key, self.get(key)).records

    def delete(self, key: str) -> None:
        self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))

    def exists(self, key: str) -> bool:
        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            if _error_code(exc) in _MISSING:
                return False
            raise
        return True

    def list(self, prefix: str = "") -> list[str]:
        if prefix and ("\\" in prefix or prefix.startswith("/") or ".." in prefix.split("/")):
            raise ObjectKeyRefused(f"listing prefix {prefix!r} refused")
        keys: list[str] = []
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            for item in page.get("Contents", []):
                name = str(item["Key"])[len(self.prefix):]
                if name and name != PREFIX_MARKER:
                    keys.append(name)
        return sorted(keys)


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def encrypted_s3_store(url: str, data_key: bytes, tenant_id: str, *, client: Any = None) -> EncryptedObjectStore:
    """The store an instance uses: S3 under its prefix, every object sealed with its tenant key."""
    return EncryptedObjectStore(S3ObjectStore.from_url(url, client=client), data_key, tenant_id)
