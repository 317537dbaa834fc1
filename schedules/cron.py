"""Time arithmetic of schedules: which cron expressions and zones are valid, when a schedule fires next, and
which fire times a sweep at ``now`` must run under the schedule's catch-up policy.

Pure functions over datetimes: no Django, no database, no clock (``now`` is always a parameter, so the sweep,
the API's ``next_fires`` and the tests agree on one instant and nothing has to patch time).

Cron times are computed in the schedule's IANA zone (``0 8 * * *`` in ``Europe/Paris`` is 08:00 Paris time,
summer and winter; croniter handles the DST gaps and repeats) and stored in UTC. Five fields, or six with
seconds last (``* * * * * */5``: every 5 seconds), or one of the ``@hourly``-style macros.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import islice
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

__all__ = ["CronInvalid", "Due", "cron_validate", "due_fires", "due_once", "first_fire", "next_fires", "zone_validate"]

_MACROS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
_MAX_EXPR_CHARS = 100
# Whole seconds: croniter's resolution. One second back from an instant, so "at or after" includes it.
_TICK = timedelta(seconds=1)


class CronInvalid(ValueError):
    """A cron expression or zone the schedule cannot use; the message is written for the API caller."""


def cron_validate(expression: object) -> str:
    """The expression, normalised to single spaces, or ``CronInvalid`` saying why."""
    if not isinstance(expression, str) or not expression.strip():
        raise CronInvalid("must be a cron expression such as `0 8 * * *`")
    if len(expression) > _MAX_EXPR_CHARS:
        raise CronInvalid(f"must be at most {_MAX_EXPR_CHARS} characters")
    fields = expression.split()
    normalised = " ".join(fields)
    if len(fields) == 1 and fields[0].lower() in _MACROS:
        return normalised.lower()
    if len(fields) not in (5, 6):
        raise CronInvalid("must have 5 fields (minute hour day month weekday) or 6 (seconds last), "
                          f"or be one of {', '.join(sorted(_MACROS))}; got {len(fields)} fields")
    if not croniter.is_valid(normalised):
        raise CronInvalid(f"{normalised!r} is not a valid cron expression")
    try:  # is_valid accepts a few expressions that never match (Feb 30): ask for one time
        croniter(normalised, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except Exception as exc:  # croniter raises its own errors, and ValueError/KeyError from its parser
        raise CronInvalid(f"{normalised!r} never fires ({exc})") from None
    return normalised


def zone_validate(name: object) -> ZoneInfo:
    """An IANA zone (``Europe/Paris``, ``UTC``); ``CronInvalid`` for anything else, offsets included."""
    if not isinstance(name, str) or name not in _zone_names():
        raise CronInvalid(f"{name!r} is not an IANA time zone (e.g. UTC, Europe/Paris, America/New_York)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronInvalid(f"{name!r} is not an IANA time zone") from None


@cache
def _zone_names() -> frozenset[str]:
    return frozenset(available_timezones())


def _after(expression: str, zone: ZoneInfo, instant: datetime) -> datetime:
    """The first fire time strictly after ``instant``, in UTC."""
    value: datetime = croniter(expression, instant.astimezone(zone)).get_next(datetime)
    return value.astimezone(UTC)


def _before(expression: str, zone: ZoneInfo, instant: datetime) -> datetime:
    """The last fire time strictly before ``instant``, in UTC."""
    value: datetime = croniter(expression, instant.astimezone(zone)).get_prev(datetime)
    return value.astimezone(UTC)


def _forward(expression: str, zone: ZoneInfo, start: datetime) -> Iterator[datetime]:
    """Fire times from ``start`` on (included when it is one), in UTC: one iterator, not one per step (building
    a croniter costs far more than stepping one)."""
    it = croniter(expression, (start - _TICK).astimezone(zone))
    while True:
        t: datetime = it.get_next(datetime).astimezone(UTC)
        if t >= start:
            yield t


def first_fire(expression: str, zone: ZoneInfo, *, after: datetime) -> datetime:
    """The first fire time strictly after ``after`` (a new, changed or resumed schedule starts there)."""
    return _after(expression, zone, after)


def next_fires(expression: str, zone: ZoneInfo, *, start: datetime, count: int) -> list[datetime]:
    """``count`` fire times from ``start`` (included when it is one), in UTC."""
    return list(islice(_forward(expression, zone, start), count))


@dataclass(frozen=True)
class Due:
    """What one sweep does for one schedule: the fire times to create, how many missed ones the policy dropped,
    and where the schedule's cursor goes (the first fire time after ``now``)."""

    fire_times: tuple[datetime, ...]
    skipped: int
    next_fire_at: datetime | None


def due_fires(*, expression: str, zone: ZoneInfo, cursor: datetime, now: datetime, grace: timedelta,
              catch_up: str, catch_up_max: int) -> Due:
    """The fire times in ``[cursor, now]`` that the policy keeps.

    A time at most ``grace`` old is on time, however the sweep was late, and always fires. An older one was
    *missed* (beat or every worker was down): ``skip`` drops them, ``latest`` keeps the newest, ``all`` keeps the
    newest ``catch_up_max``. Missed times are walked backwards from the grace boundary, so a schedule every
    second that missed a month costs ``catch_up_max`` steps, not millions.
    """
    if cursor > now:
        return Due((), 0, cursor)
    boundary = now - grace
    on_time: list[datetime] = []
    next_fire_at = now
    for t in _forward(expression, zone, max(cursor, boundary)):
        if t > now:
            next_fire_at = t
            break
        on_time.append(t)
    missed: list[datetime] = []
    if cursor < boundary:
        keep = {"skip": 0, "latest": 1}.get(catch_up, catch_up_max)
        m = _before(expression, zone, boundary)
        while m >= cursor and len(missed) < keep:
            missed.append(m)
            m = _before(expression, zone, m)
        missed.reverse()
    skipped = _count_missed(expression, zone, cursor, boundary) - len(missed) if cursor < boundary else 0
    return Due(tuple(missed + on_time), max(skipped, 0), next_fire_at)


# Counting missed times is for the record only (``skipped_fires``): past this many it stops, so a schedule every
# second that missed a month costs a bounded walk, not millions of steps.
_COUNT_CAP = 1_000


def _count_missed(expression: str, zone: ZoneInfo, cursor: datetime, boundary: datetime) -> int:
    """How many fire times fell in ``[cursor, boundary)``, counted up to ``_COUNT_CAP``."""
    n = 0
    for t in _forward(expression, zone, cursor):
        if t >= boundary or n >= _COUNT_CAP:
            break
        n += 1
    return n


def due_once(*, at: datetime, now: datetime, grace: timedelta, catch_up: str) -> Due:
    """A one-off schedule: fires at ``at`` once ``now`` reaches it; missed (older than ``grace``) and ``skip``,
    it never fires. Either way it is done (no next fire)."""
    if at > now:
        return Due((), 0, at)
    if at < now - grace and catch_up == "skip":
        return Due((), 1, None)
    return Due((at,), 0, None)
