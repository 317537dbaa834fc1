"""Work that only records what a request already did, run once its answer has left: after the WSGI (or ASGI)
server sent the last byte and closed the response, in the same thread, before Django's ``request_finished``.

Why: a conversation message's settle (the inbox row marked delivered with the instance's answer) was the last
round trip before its answer, about 1 ms of the hop on a slow machine (issue 39), yet the caller never needs it:
the answer is built from memory, and a settle that never happens leaves the item pending, which is redelivered to
an instance that de-duplicates by the item's id (docs/conversations.md, "What a message costs"). Only work with
that property belongs here: nothing the answer depends on, nothing whose loss loses or doubles anything.

``AfterResponseMiddleware`` opens a list for each request; ``after_response(job)`` appends to it, or runs ``job``
at once when no request is being answered on this thread (a Celery task, a management command, a test calling a
service directly). The jobs run when the server calls ``response.close()`` (PEP 3333: gunicorn does after writing
the body; Django's test client does before it returns the response), before the response's own ``close``, so
before ``request_finished`` (which may close the database connection when ``CONN_MAX_AGE`` is 0). A job that
raises is logged by its type and the next one still runs: the answer is already out, nothing is left to fail.

A thread-local, not a context variable: the middleware chain, the view and ``close`` run in one thread under WSGI,
and under ASGI in the request's one thread-sensitive executor thread (``sync_to_async(thread_sensitive=True)``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

__all__ = ["AfterResponseMiddleware", "after_response"]

logger = logging.getLogger(__name__)

_local = threading.local()


def after_response(job: Callable[[], object]) -> None:
    """Run ``job`` once the current request's answer has been sent; at once when there is no such request."""
    jobs: list[Callable[[], object]] | None = getattr(_local, "jobs", None)
    if jobs is None:
        job()
    else:
        jobs.append(job)


def _run(jobs: list[Callable[[], object]]) -> None:
    for job in jobs:
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - the answer is out; log and go on with the next job
            logger.warning("work after the response failed: %s", type(exc).__name__)
    jobs.clear()


class AfterResponseMiddleware:
    """Opens the request's list of ``after_response`` jobs and hands them to the response's ``close``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        outer = getattr(_local, "jobs", None)  # a request answered inside another (a test client in a view)
        jobs: list[Callable[[], object]] = []
        _local.jobs = jobs
        try:
            response = self.get_response(request)
        except BaseException:
            _local.jobs = outer
            _run(jobs)  # no response will be closed: the work is done now rather than never
            raise
        _local.jobs = outer
        if jobs:
            close = response.close

            def run_then_close() -> None:
                _run(jobs)
                close()

            response.close = run_then_close
        return response
