"""Screenshot of the server's page (GET /) while it serves: what docs/page.png shows.

    python tools/page_screenshot.py --graph bagel --preset tiny -o docs/page.png

Compiles the graph, starts `mstar-run` on a free port, opens the page in headless Chromium
(Debian's /usr/bin/chromium through Playwright), keeps a few chats decoding and makes an
image from the playground, and screenshots the page while the chats are still live.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # this checkout's runtime package, installed or not

from runtime.launch.browser import launch_chromium  # noqa: E402
from runtime.launch.server import Server, compile_plan  # noqa: E402


def _chat(url: str, model: str, max_tokens: int) -> None:
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Tell me a story."}]}
    req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=600).read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="bagel")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--chats", type=int, default=6, help="chats kept decoding during the screenshot")
    parser.add_argument("-o", "--output", default=str(ROOT / "docs" / "page.png"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright
    plan = compile_plan(Path("/tmp"), args.graph, preset=args.preset, placement=None)
    srv = Server(plan, env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(180)
        model = json.load(urllib.request.urlopen(f"{srv.url}/v1/models"))["data"][0]["id"]
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto(srv.url + "/")
            page.wait_for_selector("body[data-ready='1']")
            if page.query_selector("#image-go"):
                page.click("#image-go")
                page.wait_for_selector("#image-output[data-done='1']", timeout=300_000)
            for _ in range(args.chats):
                threading.Thread(target=_chat, args=(srv.url, model, 2000), daemon=True).start()
            page.wait_for_function(f"document.querySelectorAll('#requests tr').length > {args.chats}", timeout=60_000)
            page.wait_for_timeout(1500)                      # a few feed periods: rates and busy share settle
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=args.output, full_page=False)
            browser.close()
    finally:
        srv.stop()
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())
