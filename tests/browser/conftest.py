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


def screenshot(page, name: str, *, full_page: bool = True) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=full_page)
