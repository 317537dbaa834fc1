"""Whether a descriptor has something to read right now, without waiting: one question three places ask (an idle
database connection the server may have closed, an idle kept-alive connection to an instance, a pidfd whose process
may have exited).

``poll``, not ``select``: ``select`` refuses a descriptor above 1023, which a busy worker reaches.
"""

from __future__ import annotations

import select
from typing import Any

__all__ = ["readable_now"]


def readable_now(fd: Any, events: int = select.POLLIN) -> bool:
    """Whether ``fd`` (a descriptor, or anything with ``fileno()``) has one of ``events`` now. Raises what
    ``poll`` raises (OSError, ValueError) for a descriptor it cannot look at: each caller decides what that means."""
    poller = select.poll()
    poller.register(fd, events)
    return bool(poller.poll(0))
