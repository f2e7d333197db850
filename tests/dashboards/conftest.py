"""A real browser for the pages: Debian's chromium driven by Playwright (PyPI). Playwright's
own browser download cannot work here, so it launches the system's executable
(``$CMDARE_CHROMIUM``, else ``chromium`` on PATH; scripts/test installs it with apt).
Screenshots go to ``artefacts/screenshots`` (``$CMDARE_ARTEFACTS``)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

ARTEFACTS = Path(os.environ.get("CMDARE_ARTEFACTS", ROOT / "artefacts")) / "screenshots"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium_path() -> str | None:
    return os.environ.get("CMDARE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    exe = chromium_path()
    if not exe:
        pytest.skip("chromium is not installed here (scripts/test installs Debian's package with apt)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=FLAGS)
        yield b
        b.close()


class Watched:
    """A page whose console errors, page errors and failed requests are kept."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.problems: list[str] = []
        page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        # a request the test's own navigation cut short (net::ERR_ABORTED) is not the page's fault
        page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url} {r.failure}")
                if "ERR_ABORTED" not in (r.failure or "") else None)
        page.on("response", lambda r: self.problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

    def open(self, url: str, timeout: float = 20_000) -> Any:
        t = time.monotonic()
        self.page.goto(url)
        self.page.wait_for_selector("main[data-ready]", timeout=timeout)
        self.seconds = time.monotonic() - t
        assert self.page.get_attribute("main", "data-ready") == "1", self.page.inner_text("#error")
        return self.page

    def shot(self, name: str, docs: bool = False) -> Path:
        """A full-page screenshot in the artefacts; with ``docs`` and
        CMDARE_UPDATE_SCREENSHOTS=1, the first screen also as the README's docs/img/NAME.png."""
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        p = ARTEFACTS / f"{name}.png"
        self.page.screenshot(path=str(p), full_page=True)
        if docs and os.environ.get("CMDARE_UPDATE_SCREENSHOTS") == "1":
            self.page.screenshot(path=str(ROOT / "docs" / "img" / f"{name}.png"))
        return p


@pytest.fixture()
def page(browser: Any) -> Iterator[Watched]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, timezone_id="UTC")
    w = Watched(ctx.new_page())
    yield w
    ctx.close()
