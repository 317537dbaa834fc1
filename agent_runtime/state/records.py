"""Record objects: an object that grows by appended records, framed so that a torn last append reads as absent.

The effect journal keeps an effect's intent and its outcome as two records of one object, so that the outcome is
one appended write (no new file, no rename, no directory to fsync) instead of a second whole object. This module
holds only the byte format, shared by every object store; no I/O here.

Format: `ARL1` then frames, each a 4-byte big-endian length, the CRC-32 of the record, and the record. An object
without the magic (written whole by `put`, as journal entries were before) reads as one record, so old objects
stay readable; an append to one replaces it with a record object holding the new record.

A crash can tear only the last append (each append returns only once it is durable, and the next starts after
it): its frame is cut short, its bytes read back as zeros where the file grew before the data reached the disk, or
some of its blocks are stale (its CRC fails). Such a tail was never acknowledged, so it is dropped, and the next
append cuts it off first (`parse_records` says where the good records end) so that it never ends up mid-object.
Anything else that does not parse is corruption; so is a cut in the first record, which was written whole.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from agent_runtime.errors import CorruptState

__all__ = ["LOG_MAGIC", "Parsed", "Records", "frame", "is_record_object", "parse_records", "record_object"]

LOG_MAGIC = b"ARL1"
# A name for the type where a store's own `list` method shadows the builtin in class bodies.
Records = list[bytes]
_HEAD = struct.Struct(">II")  # length, CRC-32


class Parsed(NamedTuple):
    records: Records
    # Where the last good record ends: an append starts here (bytes beyond are a torn append's).
    end: int


def frame(record: bytes) -> bytes:
    """One record as appended: its length and CRC-32, then its bytes."""
    return _HEAD.pack(len(record), zlib.crc32(record)) + record


def record_object(records: Records) -> bytes:
    """A whole record object holding `records` (for stores that cannot append in place, and for conversions)."""
    return LOG_MAGIC + b"".join(frame(r) for r in records)


def is_record_object(head: bytes) -> bool:
    return head.startswith(LOG_MAGIC)


def parse_records(name: str, raw: bytes) -> Parsed:
    """The records of object `name`, oldest first; a torn last append is dropped (see the module's docstring)."""
    if not is_record_object(raw):
        return Parsed([raw], len(raw))
    records: Records = []
    pos = len(LOG_MAGIC)
    while pos < len(raw):
        rest = raw[pos:]
        size, crc = _HEAD.unpack_from(raw, pos) if len(rest) >= _HEAD.size else (0, 0)
        end = pos + _HEAD.size + size
        record = raw[pos + _HEAD.size:end]
        torn = (not rest.strip(b"\x00") or len(rest) < _HEAD.size or end > len(raw)
                or (end == len(raw) and zlib.crc32(record) != crc))
        if torn:
            if not records:
                raise CorruptState(f"object {name!r}: its first record is cut short (truncated or corrupted)")
            break
        if size == 0 or zlib.crc32(record) != crc:
            raise CorruptState(f"object {name!r}: the record at byte {pos} is damaged (not a torn last append)")
        records.append(record)
        pos = end
    if not records:
        raise CorruptState(f"object {name!r}: a record object without records (truncated or corrupted)")
    return Parsed(records, pos)
