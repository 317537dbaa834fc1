"""ASGI entry point of the reply-stream tier: ``GUNICORN_SERVER=asgi`` (deploy/gunicorn.conf.py) runs it in
uvicorn workers, and the ingress sends only the reply-stream URL here (docs/production.md "Reply streams").

Why a tier of its own: under the threaded workers a reply stream holds a thread until the reply ends, so
workers x threads streams at most, the rest waiting in the accept queue (bench/bench_streams.py). Here the
stream runs on the event loop (``conversations.streams.areply_events``).

Why not Django's own ``get_asgi_application()``: it gives every request its own thread for the sync parts
(``ThreadSensitiveContext``), kept until the response ends, so each open stream would still pin an idle thread
and, through it, a database connection. This handler leaves that context out: the sync parts of every request
(middleware, authentication, throttle, the view up to its first byte) run one after another in one thread per
process, which keeps one persistent database connection. Fine for short pre-stream work; a tier serving slow
sync views would queue them behind each other, which is why the rest of the API stays on the threaded workers.
"""

from __future__ import annotations

import os
from typing import Any

import django
from django.core.handlers.asgi import ASGIHandler

__all__ = ["application"]


class StreamTierHandler(ASGIHandler):
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: uvicorn carries on without it
            raise ValueError(f"Django serves HTTP only, not {scope['type']}")
        await self.handle(scope, receive, send)  # no ThreadSensitiveContext: see the module docstring


os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django.setup(set_prefix=False)
application = StreamTierHandler()
