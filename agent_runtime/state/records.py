"""Record objects: an object that grows by appended records, framed so that a torn last append reads as absent.

The effect journal keeps an effect's intent and its outcome as two records of one object, so that the outcome is
one appended write (no new file, no rename, no directory to fsync) instead of a second whole object. This module
holds only the byte format, shared by every object store; no I/O here.

Format: `ARL1` then frames, each a 4-byte big-endian length and that many bytes. An object without the magic
(written whole by `put`, as journal entries were before) reads as one record, so old objects stay readable; an
append to one replaces it with a record object holding the new record.

A crash can tear only the last append (each append returns only once it is durable, and the next starts after
it): its frame is cut short, or its bytes read back as zeros where the file grew before the data reached the disk.
Such a tail was never acknowledged, so it is dropped; anything else that does not parse is corruption.
"""

from __future__ import annotations

import struct

from agent_runtime.errors import CorruptState

__all__ = ["LOG_MAGIC", "Records", "frame", "is_record_object", "parse_records", "record_object"]

LOG_MAGIC = b"ARL1"
# A name for the type where a store's own `list` method shadows the builtin in class bodies.
Records = list[bytes]
_LEN = struct.Struct(">I")


def frame(record: bytes) -> bytes:
    """One record as appended: its length, then its bytes."""
    return _LEN.pack(len(record)) + record


def record_object(records: list[bytes]) -> bytes:
    """A whole record object holding `records` (for stores that cannot append in place, and for conversions)."""
    return LOG_MAGIC + b"".join(frame(r) for r in records)


def is_record_object(head: bytes) -> bool:
    return head.startswith(LOG_MAGIC)


def parse_records(name: str, raw: bytes) -> list[bytes]:
    """The records of object `name`, oldest first; a torn last append is dropped (see the module's docstring)."""
    if not is_record_object(raw):
        return [raw]
    records: list[bytes] = []
    pos = len(LOG_MAGIC)
    while pos < len(raw):
        rest = raw[pos:]
        (size,) = _LEN.unpack_from(raw, pos) if len(rest) >= _LEN.size else (0,)
        torn = (not rest.strip(b"\x00")  # the file grew but the last append's data never reached the disk
                or len(rest) < _LEN.size or pos + _LEN.size + size > len(raw))  # the last append was cut short
        if torn:
            if not records:  # the first record was written whole and atomically: it cannot be torn
                raise CorruptState(f"object {name!r}: its first record is cut short (truncated or corrupted)")
            break
        end = pos + _LEN.size + size
        if size == 0:
            raise CorruptState(f"object {name!r}: an empty record at byte {pos} (not an append of ours)")
        records.append(raw[pos + _LEN.size:end])
        pos = end
    if not records:
        raise CorruptState(f"object {name!r}: a record object without records (truncated or corrupted)")
    return records
