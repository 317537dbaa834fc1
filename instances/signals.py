"""Signals of the instance-facing API, for apps above ``instances`` that act on what an instance says.

``heartbeat_received`` is sent after a heartbeat is recorded, with ``tenant_id`` and the instance's reported
``status`` (``None`` when it sent none). Receivers connect in their ``AppConfig.ready()``; they run inside the
request (``send``, not ``send_robust``: a receiver's error is the request's, as when the view called it), so
they must be quick: queue work with ``transaction.on_commit``.
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = ["heartbeat_received"]

heartbeat_received = Signal()
