"""The drift check covers the whole fleet in turn (issue 16): a rolling window, not the same head every run.

It used to order by ``updated_at``, which heartbeats never bump, so past 500 instances the same 500 were
checked every minute and the rest never. Instances here have no resources, so observing them finds nothing
and the test watches only which ones each run took.
"""

from __future__ import annotations

import pytest

from provisioning.choices import InstanceStatus
from provisioning.models import AgentInstance
from provisioning.recovery.sweep import drift_check
from tenants.models import Tenant

pytestmark = pytest.mark.django_db


def _fleet(operator, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    ids = []
    for i in range(n):
        tenant = Tenant.objects.create(operator=operator, slug=f"win-{i}", name=f"Win {i}", status="ready")
        ids.append(str(AgentInstance.objects.create(tenant=tenant, status=InstanceStatus.RUNNING).pk))
    return ids


def _checked() -> dict[str, object]:
    return {str(pk): at for pk, at in AgentInstance.objects.values_list("pk", "drift_checked_at") if at}


def test_every_instance_is_checked_within_ceil_n_over_limit_runs_then_the_oldest_again(operator):
    fleet = _fleet(operator, 7)
    seen: list[set[str]] = []
    for _ in range(3):
        before = _checked()
        assert drift_check(limit=3) == []
        after = _checked()
        seen.append({pk for pk, at in after.items() if before.get(pk) != at})
    assert [len(s) for s in seen] == [3, 3, 3]
    assert set().union(*seen) == set(fleet)  # all 7 within ceil(7 / 3) = 3 runs
    assert len(seen[0] & seen[1]) == 0 and len(seen[2] - seen[0]) == 1  # the third wraps to the oldest
    fourth_before = _checked()
    drift_check(limit=3)
    oldest = sorted(fourth_before, key=lambda pk: (fourth_before[pk], pk))[:3]
    assert {pk for pk, at in _checked().items() if fourth_before[pk] != at} == set(oldest)


def test_instances_the_check_skips_are_not_stamped(operator):
    fleet = _fleet(operator, 3)
    AgentInstance.objects.filter(pk=fleet[0]).update(status=InstanceStatus.STOPPED)
    Tenant.objects.filter(instance__pk=fleet[1]).update(status="suspended")
    drift_check(limit=10)
    assert set(_checked()) == {fleet[2]}
