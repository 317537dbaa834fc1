"""Issue 35, the time arithmetic of schedules (schedules/cron.py: pure functions, ``now`` a parameter)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from schedules.cron import CronInvalid, cron_validate, due_fires, next_fires, zone_validate

PARIS = ZoneInfo("Europe/Paris")


def test_a_zone_s_wall_clock_is_kept_across_daylight_saving():
    # 08:00 Paris: 07:00 UTC before the change on 29 March 2026, 06:00 UTC after it.
    fires = next_fires("0 8 * * *", PARIS, start=datetime(2026, 3, 28, tzinfo=UTC), count=3)
    assert fires == [datetime(2026, 3, 28, 7, tzinfo=UTC), datetime(2026, 3, 29, 6, tzinfo=UTC),
                     datetime(2026, 3, 30, 6, tzinfo=UTC)]
    # 02:30 does not exist on the spring-forward night: that day's fire is not lost, nor doubled.
    night = next_fires("30 2 * * *", PARIS, start=datetime(2026, 3, 28, tzinfo=UTC), count=3)
    assert len(set(night)) == 3 and [t.date().day for t in night] == [28, 29, 30]


def test_seconds_are_the_sixth_field_and_macros_are_accepted():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert next_fires("* * * * * */20", ZoneInfo("UTC"), start=start, count=3) == [
        start, start + timedelta(seconds=20), start + timedelta(seconds=40)]
    assert cron_validate("  @Daily ") == "@daily"
    assert cron_validate("0  8 * *   1-5") == "0 8 * * 1-5"


@pytest.mark.parametrize("bad", ["", "@reboot", "* * * *", "* * * * * * *", "0 25 * * *", "0 0 31 2 *", 5])
def test_what_cron_validate_refuses(bad):
    with pytest.raises(CronInvalid):
        cron_validate(bad)


@pytest.mark.parametrize("bad", ["Europe/Pariss", "+02:00", "", "../etc/passwd", None])
def test_what_zone_validate_refuses(bad):
    with pytest.raises(CronInvalid):
        zone_validate(bad)


def test_a_long_outage_costs_a_bounded_walk_and_keeps_the_newest_missed_times():
    cursor = datetime(2026, 1, 1, tzinfo=UTC)
    now = cursor + timedelta(days=30)
    due = due_fires(expression="* * * * * *", zone=ZoneInfo("UTC"), cursor=cursor, now=now,
                    grace=timedelta(seconds=2), catch_up="all", catch_up_max=3)
    assert due.fire_times == tuple(now - timedelta(seconds=s) for s in (5, 4, 3, 2, 1, 0))  # 3 missed, 3 on time
    assert due.next_fire_at == now + timedelta(seconds=1)
    assert due.skipped == 1_000 - 3  # counted up to the cap: a record, not a bill
    not_yet = due_fires(expression="* * * * * *", zone=ZoneInfo("UTC"), cursor=now + timedelta(seconds=1), now=now,
                        grace=timedelta(seconds=2), catch_up="all", catch_up_max=3)
    assert (not_yet.fire_times, not_yet.next_fire_at) == ((), now + timedelta(seconds=1))
