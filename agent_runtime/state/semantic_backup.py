"""Streaming object-store backup of one semantic index: parts of bounded size, then a manifest.

`semantic/<model>.index` is the manifest (format, model, dimensions, row count, and per part: key, rows,
SHA-256); the parts live under `semantic/<model>/<backup id>/part-NNNNN`, each a few MB of JSON lines
(doc id, content hash, text, metadata, float32 vector in base64), written while a server-side cursor
walks the table in one snapshot. The manifest is written last, so a backup cut short leaves the previous
one intact; parts of earlier backups are deleted after it. Reading verifies what a restore relies on:
each part's digest and row count against the manifest, each record's content hash against its text and
its vector's length against the dimensions; any mismatch is CorruptState. Never more than one part in
memory. The format of earlier runtimes (the whole index as JSON lines in the manifest's key) is still read.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agent_runtime.codec import sha256_hex
from agent_runtime.errors import CorruptState, SnapshotMissing
from agent_runtime.state.objectstore import ObjectStore

__all__ = ["FORMAT", "ROWS_PER_PART", "Record", "backup_keys", "read_backup", "write_backup"]

FORMAT = "agent_runtime.semantic/2"
ROWS_PER_PART = 2000


@dataclass(frozen=True)
class Record:
    doc_id: str
    content_hash: str
    text: str
    metadata: dict[str, Any]
    vec: bytes  # float32 little-endian


def backup_keys(model: str) -> tuple[str, str]:
    """(manifest key, prefix of the parts) for `model`; the manifest key is the one earlier runtimes used."""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    return f"semantic/{slug}.index", f"semantic/{slug}/"


def write_backup(store: ObjectStore, model: str, dim: int, layout: str, rows: Iterator[Record],
                 rows_per_part: int = ROWS_PER_PART) -> dict[str, Any]:
    """Write `rows` as parts, then the manifest; delete the parts of earlier backups. Returns the manifest."""
    manifest_key, prefix = backup_keys(model)
    backup_id = time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(4)
    parts: list[dict[str, Any]] = []
    buf: list[bytes] = []

    def flush() -> None:
        if not buf:
            return
        data = b"\n".join(buf) + b"\n"
        key = f"{prefix}{backup_id}/part-{len(parts) + 1:05d}"
        store.put(key, data)
        parts.append({"key": key, "rows": len(buf), "sha256": hashlib.sha256(data).hexdigest()})
        buf.clear()

    for rec in rows:
        buf.append(json.dumps({"i": rec.doc_id, "h": rec.content_hash, "t": rec.text, "m": rec.metadata,
                               "v": base64.b64encode(rec.vec).decode()}, separators=(",", ":")).encode())
        if len(buf) >= rows_per_part:
            flush()
    flush()
    manifest = {"format": FORMAT, "model": model, "dim": dim, "layout": layout, "backup_id": backup_id,
                "rows": sum(p["rows"] for p in parts), "parts": parts}
    store.put(manifest_key, json.dumps(manifest).encode())
    keep = {p["key"] for p in parts}
    for key in store.list(prefix):
        if key not in keep:
            store.delete(key)
    return manifest


def _record(rec: dict[str, Any], dim: int, where: str) -> Record:
    try:
        vec = base64.b64decode(rec["v"], validate=True)
        out = Record(str(rec["i"]), str(rec["h"]), str(rec["t"]), dict(rec.get("m") or {}), vec)
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptState(f"semantic index backup {where} is corrupt") from exc
    if len(vec) != 4 * dim:
        raise CorruptState(f"semantic index backup {where}: embedding has {len(vec) // 4} floats, expected {dim}")
    if sha256_hex(out.text) != out.content_hash:
        raise CorruptState(f"semantic index backup {where}: content hash mismatch")
    return out


def _lines(data: bytes, where: str) -> Iterator[dict[str, Any]]:
    for line in data.splitlines():
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise CorruptState(f"semantic index backup {where} is corrupt") from exc
        if not isinstance(rec, dict):
            raise CorruptState(f"semantic index backup {where} is corrupt")
        yield rec


def read_backup(store: ObjectStore, model: str) -> tuple[int, Callable[[], Iterator[list[Record]]]]:
    """(dimensions, a generator of verified record batches, one part at a time). SnapshotMissing if none."""
    manifest_key, _ = backup_keys(model)
    head = store.get(manifest_key)
    try:
        manifest = json.loads(head)
    except ValueError:
        manifest = None
    if not (isinstance(manifest, dict) and manifest.get("format") == FORMAT):
        return _read_legacy(head, manifest_key)
    try:
        dim, parts, total = int(manifest["dim"]), list(manifest["parts"]), int(manifest["rows"])
        if manifest["model"] != model:
            raise CorruptState(f"semantic index backup {manifest_key} holds model {manifest['model']!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptState(f"semantic index backup {manifest_key}: unreadable manifest") from exc
    if sum(int(p["rows"]) for p in parts) != total:
        raise CorruptState(f"semantic index backup {manifest_key}: parts do not add up to {total} rows")

    def batches() -> Iterator[list[Record]]:
        for part in parts:
            try:
                data = store.get(part["key"])
            except SnapshotMissing as exc:
                raise CorruptState(f"semantic index backup {manifest_key}: part {part['key']} is missing") from exc
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise CorruptState(f"semantic index backup {manifest_key}: part {part['key']} digest mismatch")
            recs = [_record(r, dim, part["key"]) for r in _lines(data, part["key"])]
            if len(recs) != int(part["rows"]):
                raise CorruptState(f"semantic index backup {manifest_key}: part {part['key']} has {len(recs)}"
                                   f" rows, the manifest says {part['rows']}")
            yield recs

    return dim, batches


def _read_legacy(blob: bytes, where: str) -> tuple[int, Callable[[], Iterator[list[Record]]]]:
    """The pre-2 format: every record in one object, {"h", "d", "n", "v", "t"} per line."""
    recs = []
    dim = 0
    for rec in _lines(blob, where):
        try:
            dim = int(rec["n"])
            recs.append(_record({"i": rec["d"], "h": rec["h"], "t": rec["t"], "v": rec["v"]}, dim, where))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptState(f"semantic index backup {where} is corrupt") from exc

    def batches() -> Iterator[list[Record]]:
        if recs:
            yield recs

    return dim, batches
