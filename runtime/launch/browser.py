"""The headless Chromium that opens the server's page: Debian's `chromium` package driven by Playwright
(Playwright's own browser download is not reachable from these machines; `.ci/run` installs it with apt-get)."""
from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch_chromium(playwright: Any) -> Any:
    """The system Chromium, headless, started through a running `sync_playwright()` (a Browser)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
