"""``controlplane.after_response``: work that only records what a request did runs once its answer is out (issue 39:
a message's settle). The conversation side, against a real agent-host, is in
tests/conversations/test_conversations_e2e.py."""

from __future__ import annotations

import logging

from django.core.signals import request_finished
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from controlplane.after_response import AfterResponseMiddleware, after_response


def test_outside_a_request_the_work_runs_at_once():
    done: list[str] = []
    after_response(lambda: done.append("settled"))
    assert done == ["settled"]


def test_the_work_waits_for_close_and_runs_before_request_finished_even_when_a_job_fails(caplog):
    events: list[str] = []

    def failing() -> None:
        events.append("failing job")
        raise ConnectionError("the database went away")

    def view(request: HttpRequest) -> HttpResponse:
        after_response(failing)
        after_response(lambda: events.append("second job"))
        events.append("view returned")
        return HttpResponse(b"answer")

    def finished(**kwargs: object) -> None:
        events.append("request_finished")

    response = AfterResponseMiddleware(view)(RequestFactory().post("/x"))
    assert events == ["view returned"], "nothing runs before the server has sent the answer and closes it"
    assert response.content == b"answer"
    # As Django's test client does: Django's own receiver (which may close the connection) is not this test's.
    request_finished.disconnect(close_old_connections)
    request_finished.connect(finished)
    try:
        with caplog.at_level(logging.WARNING, logger="controlplane.after_response"):
            response.close()
    finally:
        request_finished.disconnect(finished)
        request_finished.connect(close_old_connections)
    # Before request_finished, which may close the database connection (CONN_MAX_AGE 0); a failing job is logged by
    # its type and the next one still runs.
    assert events == ["view returned", "failing job", "second job", "request_finished"]
    assert "ConnectionError" in caplog.text and "database went away" not in caplog.text
    assert response.closed


def test_a_request_without_such_work_keeps_its_own_close_and_the_next_request_starts_empty():
    ran: list[str] = []

    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse(b"plain")

    response = AfterResponseMiddleware(view)(RequestFactory().get("/x"))
    assert "close" not in vars(response), "a response with no work is left as it is"
    after_response(lambda: ran.append("outside"))  # the request's list is gone: this runs at once
    assert ran == ["outside"]
