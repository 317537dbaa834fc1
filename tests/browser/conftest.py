"""Real headless Chromium (Debian's /usr/bin/chromium) driven by Playwright for Python.

No browser is downloaded: Playwright launches the system Chromium via ``executable_path``.
If it is missing the tests fail (they are never skipped): install it with
``apt-get install -y chromium``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

# Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still sync.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# docs/screenshots is refreshed only on request (UPDATE_SCREENSHOTS=1); a normal run keeps its pictures in a
# temporary folder so the working tree stays clean. The screenshot is taken either way: it is part of the flow.
SCREENSHOTS = (Path(__file__).resolve().parents[2] / "docs" / "screenshots" if os.environ.get("UPDATE_SCREENSHOTS")
               else Path(tempfile.gettempdir()) / "cp-test-screenshots")


@pytest.fixture(scope="session")
def chromium() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} not found: apt-get install -y chromium"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium) -> Iterator[object]:
    context = chromium.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(20_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def live_port(live_server) -> int:
    return int(urlparse(live_server.url).port)


@pytest.fixture
def processes_alive() -> Iterator[None]:
    """This process beats as the worker (on the default queue) and as beat, so staff pages show no incident banner:
    a screen's screenshot shows the screen (tests/browser/test_incident_banner.py shows the banner)."""
    from django.conf import settings

    from controlplane.liveness import heartbeat_start, heartbeat_stop

    heartbeat_start("beat")
    heartbeat_start("worker", queues=(settings.CELERY_TASK_DEFAULT_QUEUE,))
    yield
    heartbeat_stop("worker")
    heartbeat_stop("beat")


def screenshot(page, name: str, *, full_page: bool = True, max_height: int | None = None) -> None:
    """``page`` as ``name``.png; ``max_height`` cuts a long page's picture at that many px from the top (a
    picture in docs/ stays under ~400 KB)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    clip = None
    if max_height is not None:
        width, height = page.evaluate("[document.documentElement.clientWidth, document.documentElement.scrollHeight]")
        clip = {"x": 0, "y": 0, "width": width, "height": min(height, max_height)}
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page, clip=clip)


def collect_console_errors(page) -> list[str]:
    """Every console error and uncaught exception of ``page`` from now on, for a test to assert empty; the
    favicon's included (every page links one: templates/ui/base.html, tests/controlplane/test_favicon.py)."""
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(f"{msg.text} ({msg.location.get('url', '')})")
            if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    return problems


# The outermost elements past the right edge (and any absolute one: it may escape its scroller), with their
# ancestors: where a fix belongs.
_PAST_THE_EDGE = """() => {
    const edge = document.documentElement.clientWidth + 0.5, past = e => e.getBoundingClientRect().right > edge;
    const name = e => e.tagName.toLowerCase() + (e.getAttribute('class') ? '.' + e.getAttribute('class') : '')
        + (e.dataset.testid ? '[' + e.dataset.testid + ']' : '');
    return [...document.querySelectorAll('body *')]
        .filter(e => past(e) && (!past(e.parentElement) || getComputedStyle(e).position === 'absolute'))
        .slice(0, 5).map(e => {
            const chain = [];
            for (let a = e; a && a !== document.body; a = a.parentElement) chain.unshift(name(a));
            return chain.join(' > ') + ' ' + Math.round(e.getBoundingClientRect().right);
        });
}"""
WIDTHS = (1440, 390)  # a laptop and a phone: issue 37's screens are checked at both


def at_width(page, width: int) -> None:
    """Resize ``page`` to ``width`` px (a phone's height at 390) and assert it does not scroll sideways."""
    page.set_viewport_size({"width": width, "height": 844 if width < 600 else 900})
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    if overflow > 0:
        # The outermost elements past the edge (and any absolute one: it may escape its scroller), with their ancestors.
        wide = page.evaluate(_PAST_THE_EDGE)
        raise AssertionError(f"{page.url} scrolls sideways by {overflow} px at {width} px: {wide}")
