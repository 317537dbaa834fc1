"""Instance heartbeats: a fast store for liveness and progress, separate from PostgreSQL's record.

Heartbeats arrive every couple of seconds from every instance; writing each one to
PostgreSQL would make the record of state pay for chatter. The Redis store keeps two
sorted sets keyed by instance id, scored by "last seen" and "progress last changed", so
a sweep finds silent and stalled instances with two range queries whatever the fleet
size. PostgreSQL (``AgentInstance.last_heartbeat_at`` / ``progress``) is refreshed by
``heartbeats_sync`` in batches. Without Redis (the embedded default) a PostgreSQL store
with the same interface is used.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings

__all__ = ["Beat", "HeartbeatStore", "heartbeat_store", "heartbeat_record", "heartbeats_sync", "BUSY_STATUS"]

# The runtime reports "working" while a task step is in flight; only then can progress stall.
BUSY_STATUS = "working"


@dataclass(frozen=True)
class Beat:
    instance_id: str
    seen_at: float
    progress_seq: int
    progress_changed_at: float
    progress: dict[str, Any]


class HeartbeatStore(Protocol):
    def record(self, instance_id: str, progress: dict[str, Any], now: float | None = None) -> None: ...
    def get(self, instance_id: str) -> Beat | None: ...
    def silent_since(self, cutoff: float) -> list[str]: ...
    def stalled_since(self, cutoff: float) -> list[str]: ...
    def forget(self, instance_id: str) -> None: ...
    def dirty(self, limit: int) -> list[Beat]: ...


_RECORD_LUA = """
local old = redis.call('HGET', KEYS[3], 'seq')
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
local changed = redis.call('HGET', KEYS[3], 'changed')
if (not old) or old ~= ARGV[2] or not changed then
  changed = ARGV[1]
end
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[2], changed, ARGV[4])
else
  redis.call('ZREM', KEYS[2], ARGV[4])
end
redis.call('HSET', KEYS[3], 'seq', ARGV[2], 'at', ARGV[1], 'progress', ARGV[3], 'changed', changed)
redis.call('SADD', KEYS[4], ARGV[4])
return 1
"""


class RedisHeartbeatStore:
    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self._redis = redis.Redis.from_url(url)
        self._p = prefix
        self._record = self._redis.register_script(_RECORD_LUA)

    def _keys(self, instance_id: str) -> list[str]:
        return [f"{self._p}:seen", f"{self._p}:busy", f"{self._p}:i:{instance_id}", f"{self._p}:dirty"]

    def record(self, instance_id: str, progress: dict[str, Any], now: float | None = None) -> None:
        now = time.time() if now is None else now
        busy = "1" if progress.get("status") == BUSY_STATUS else "0"
        seq = int(progress.get("progress_seq") or 0)
        self._record(keys=self._keys(instance_id), args=[now, seq, json.dumps(progress), instance_id, busy])

    def get(self, instance_id: str) -> Beat | None:
        raw = self._redis.hgetall(self._keys(instance_id)[2])
        return _beat(instance_id, raw) if raw else None

    def silent_since(self, cutoff: float) -> list[str]:
        return [_member(m) for m in self._redis.zrangebyscore(f"{self._p}:seen", "-inf", f"({cutoff}")]

    def stalled_since(self, cutoff: float) -> list[str]:
        return [_member(m) for m in self._redis.zrangebyscore(f"{self._p}:busy", "-inf", f"({cutoff}")]

    def forget(self, instance_id: str) -> None:
        seen, busy, item, dirty = self._keys(instance_id)
        pipe = self._redis.pipeline()
        # One call per command: redis-py types a queued command's result as the reply, not the pipeline.
        pipe.zrem(seen, instance_id)
        pipe.zrem(busy, instance_id)
        pipe.delete(item)
        pipe.srem(dirty, instance_id)
        pipe.execute()

    def dirty(self, limit: int) -> list[Beat]:
        ids = [_member(m) for m in self._redis.spop(f"{self._p}:dirty", limit) or []]
        pipe = self._redis.pipeline()
        for instance_id in ids:
            pipe.hgetall(self._keys(instance_id)[2])
        return [_beat(i, raw) for i, raw in zip(ids, pipe.execute(), strict=True) if raw]


def _member(raw: object) -> str:
    """A set member as text. Our client keeps redis-py's default of bytes replies; redis-py types a reply
    as every shape it can take (str when decoding, tuples with scores), so this narrows it and says so."""
    if not isinstance(raw, bytes):
        raise TypeError(f"expected a bytes reply from Redis, got {type(raw).__name__}")
    return raw.decode()


def _beat(instance_id: str, raw: dict[bytes | str, bytes | str]) -> Beat:
    return Beat(
        instance_id=instance_id,
        seen_at=float(raw[b"at"]),
        progress_seq=int(raw[b"seq"]),
        progress_changed_at=float(raw[b"changed"]),
        progress=json.loads(raw[b"progress"]),
    )


class PostgresHeartbeatStore:
    """The same interface on ``AgentInstance`` rows, for the embedded default (no Redis)."""

    def record(self, instance_id: str, progress: dict[str, Any], now: float | None = None) -> None:
        from provisioning.models import AgentInstance

        at = datetime.fromtimestamp(time.time() if now is None else now, tz=UTC)
        seq = int(progress.get("progress_seq") or 0)
        instance = AgentInstance.objects.filter(pk=instance_id).values("progress").first()
        if instance is None:
            return
        old = instance["progress"] or {}
        changed = old.get("_changed_at") if old.get("progress_seq") == seq else None
        stored = {**progress, "progress_seq": seq, "_changed_at": changed or at.timestamp()}
        AgentInstance.objects.filter(pk=instance_id).update(last_heartbeat_at=at, progress=stored)

    def get(self, instance_id: str) -> Beat | None:
        from provisioning.models import AgentInstance

        row = AgentInstance.objects.filter(pk=instance_id).values("last_heartbeat_at", "progress").first()
        if row is None or row["last_heartbeat_at"] is None:
            return None
        progress = dict(row["progress"] or {})
        changed = float(progress.pop("_changed_at", row["last_heartbeat_at"].timestamp()))
        return Beat(instance_id, row["last_heartbeat_at"].timestamp(), int(progress.get("progress_seq") or 0),
                    changed, progress)

    def silent_since(self, cutoff: float) -> list[str]:
        from provisioning.models import AgentInstance

        when = datetime.fromtimestamp(cutoff, tz=UTC)
        return [str(i) for i in AgentInstance.objects.filter(last_heartbeat_at__lt=when).values_list("pk", flat=True)]

    def stalled_since(self, cutoff: float) -> list[str]:
        from provisioning.models import AgentInstance

        rows = AgentInstance.objects.filter(progress__status=BUSY_STATUS, progress___changed_at__lt=cutoff)
        return [str(i) for i in rows.values_list("pk", flat=True)]

    def forget(self, instance_id: str) -> None:
        from provisioning.models import AgentInstance

        AgentInstance.objects.filter(pk=instance_id).update(last_heartbeat_at=None, progress={})

    def dirty(self, limit: int) -> list[Beat]:
        return []  # already in PostgreSQL


@functools.cache
def _store_for(url: str, prefix: str) -> HeartbeatStore:
    return RedisHeartbeatStore(url, prefix) if url else PostgresHeartbeatStore()


def heartbeat_store() -> HeartbeatStore:
    return _store_for(settings.HEARTBEAT_REDIS_URL, settings.HEARTBEAT_KEY_PREFIX)


def heartbeat_record(*, instance_id: str, progress: dict[str, Any]) -> None:
    heartbeat_store().record(instance_id, progress)


def heartbeats_sync(limit: int = 5000) -> int:
    """Copy recently changed heartbeats from Redis to PostgreSQL (the record), in one bulk update."""
    from provisioning.models import AgentInstance

    beats = heartbeat_store().dirty(limit)
    if not beats:
        return 0
    by_id = {b.instance_id: b for b in beats}
    rows = list(AgentInstance.objects.filter(pk__in=list(by_id)))
    for row in rows:
        beat = by_id[str(row.pk)]
        row.last_heartbeat_at = datetime.fromtimestamp(beat.seen_at, tz=UTC)
        row.progress = beat.progress
    AgentInstance.objects.bulk_update(rows, ["last_heartbeat_at", "progress"])
    return len(rows)

