"""The Celery app. Tasks live in each app's ``tasks.py`` and stay thin: ids in, a service call, done.

Without ``CELERY_BROKER_URL`` the broker is the embedded Redis under ``var/redis`` (configured in settings).
The worker and beat each start a liveness heartbeat once they are up (``controlplane/liveness.py``).
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_ready, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

# Every task runs through FencedTask: a periodic job sent by a deposed beat leader is dropped (leases/fence.py).
app = Celery("controlplane", task_cls="controlplane.leases.fence:FencedTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["controlplane.jobs"])  # the job kernel's drive and stall sweep (not an installed app)


@worker_ready.connect
def _worker_heartbeat_start(sender: Any = None, **_: Any) -> None:
    from .liveness import heartbeat_start

    # The sender is the worker's consumer; the queues it consumes go into its heartbeat (workers per queue).
    consume_from = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
    queues = tuple(sorted(consume_from.consume_from)) if consume_from is not None else ()
    heartbeat_start("worker", queues=queues)


@worker_shutdown.connect
def _worker_heartbeat_stop(**_: Any) -> None:
    from .liveness import heartbeat_stop

    heartbeat_stop("worker")


@beat_init.connect
def _beat_heartbeat_start(**_: Any) -> None:
    from .liveness import heartbeat_start

    heartbeat_start("beat")  # beat has no shutdown signal: the thread's atexit hook removes its record
