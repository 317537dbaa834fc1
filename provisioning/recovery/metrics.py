"""Prometheus text exposition at /metrics: recoveries by reason and outcome, time to recover, quarantined.

Figures are read from PostgreSQL at scrape time (a custom collector), so every web process reports
the same totals and nothing is lost on restart. Access: staff session, or ``Authorization: Bearer
<METRICS_TOKEN>`` when that setting is set.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from provisioning.selectors import quarantined_count, recovery_counts, recovery_durations_s

__all__ = ["metrics_view"]

BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class RecoveryCollector:
    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily("controlplane_recoveries", "Instance recoveries", labels=["reason", "outcome"])
        for reason, outcome, n in recovery_counts():
            total.add_metric([reason, outcome], n)
        yield total
        durations = recovery_durations_s()
        buckets = [(str(b), sum(1 for d in durations if d <= b)) for b in BUCKETS_S]
        buckets.append(("+Inf", len(durations)))
        yield HistogramMetricFamily("controlplane_time_to_recover_seconds", "Detection to resumed step",
                                    buckets=buckets, sum_value=sum(durations))
        yield GaugeMetricFamily("controlplane_instances_quarantined", "Instances quarantined after failed "
                                "recoveries", value=quarantined_count())


def _allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(header.encode(), f"Bearer {token}".encode()):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff)


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        return HttpResponse("metrics need a staff session or the metrics token\n", status=401,
                            content_type="text/plain", headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RecoveryCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
