"""``manage.py check --deploy``: the isolation posture (``posture.py``) as Django system checks.

A degraded boundary is a warning, a failed one an error; boundaries that hold say nothing (Django's
convention: checks report problems). ``manage.py isolation_posture`` and the dashboard's isolation
page show every line, passing ones included.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from provisioning.fleet.posture import DEGRADED, FAIL, isolation_posture

__all__ = ["isolation_posture_check"]


# Stable ids per boundary, so a deployment can silence one knowingly (SILENCED_SYSTEM_CHECKS).
_IDS = {"OS identity": 1, "sandbox": 2, "secrets": 3, "instance environment": 4, "database auth": 5,
        "database connect": 6, "broker auth": 7, "heartbeats auth": 8, "cache auth": 9, "database separation": 10,
        "resource limits": 11, "instance address": 12, "disk quota": 13,
        "identity range": 14, "loopback services (inside)": 15, "database trust (inside)": 16,
        "redis auth (inside)": 17, "other tenants (inside)": 18, "network": 19}


@checks.register("isolation", deploy=True)
def isolation_posture_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for line in isolation_posture():
        number = 100 + _IDS.get(line.boundary, 99)
        if line.status == DEGRADED:
            messages.append(checks.Warning(f"isolation: {line.boundary} is degraded: {line.detail}",
                                           hint=line.fix or None, id=f"provisioning.W{number}"))
        elif line.status == FAIL:
            messages.append(checks.Error(f"isolation: {line.boundary} fails: {line.detail}",
                                         hint=line.fix or None, id=f"provisioning.E{number}"))
    return messages
