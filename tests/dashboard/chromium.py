"""Debian's headless Chromium, driven by Playwright, for the dashboard's browser tests:
one way to start it, and a tab that fails the test on any JavaScript error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
CHROMIUM = "/usr/bin/chromium"
# No sandbox (root in CI), and nothing that reaches outside this machine.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A started browser; screenshots go to ARTIFACTS."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def tab(browser: Any, base_url: str, *, width: int, height: int,
        timeout_ms: int = 20_000) -> Iterator[Page]:
    """A page of `browser`; a JavaScript error on it fails the test when it closes."""
    errors: list[Any] = []
    page = browser.new_page(viewport={"width": width, "height": height}, base_url=base_url)
    page.set_default_timeout(timeout_ms)
    page.on("pageerror", lambda error: errors.append(error))
    try:
        yield page
    finally:
        page.close()
    assert not errors, f"JavaScript errors: {errors}"
