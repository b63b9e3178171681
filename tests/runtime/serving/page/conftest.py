"""Browser tests of the page: headless Chromium (Debian's `chromium` package) driven by Playwright.

Playwright's own browser download is not reachable from these machines, so the tests
point Playwright at the system Chromium (runtime/launch/browser.py); they skip only where
/usr/bin/chromium is absent (`.ci/run` installs it with apt-get).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.runtime.serving.conftest import Server, plan_dir, serve  # noqa: F401  (plan_dir: the session fixture)
from mstar_compiler.plan import load_plan
from runtime.launch.browser import CHROMIUM, launch_chromium

# Records, per node, the highest `running` the feed showed, whether the page lit it up and whether
# it marked the followed request there.
WATCH_JS = """() => {
  window.seen = {maxRunning: {}, lit: {}, tracked: {}, maxBuffered: {}};
  window.mstar.feed.source.addEventListener('state', ev => {
    const s = JSON.parse(ev.data);
    for (const [n, v] of Object.entries(s.nodes))
      window.seen.maxRunning[n] = Math.max(window.seen.maxRunning[n] || 0, v.running);
    for (const [n, v] of Object.entries(s.streams))
      window.seen.maxBuffered[n] = Math.max(window.seen.maxBuffered[n] || 0, v.buffered);
    for (const g of document.querySelectorAll('svg#graph g.node.busy')) window.seen.lit[g.dataset.node] = true;
    for (const g of document.querySelectorAll('svg#graph g.node.tracked')) window.seen.tracked[g.dataset.node] = true;
  });
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Module-scoped: Playwright's sync API holds an asyncio loop in this thread while it runs,
    which would break every later test that runs its own loop."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (Debian: apt-get install -y chromium; .ci/run does it)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = launch_chromium(pw)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def open_page(page: Any, url: str) -> None:
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    page.wait_for_function("document.body.dataset.snapshots > 0", timeout=30_000)
    page.evaluate(WATCH_JS)


def drawn(page: Any) -> tuple[set[str], set[tuple[str, str, str]]]:
    """(node names, links as (kind, src, dst)) of the SVG on the page."""
    nodes = set(page.eval_on_selector_all("svg#graph g.node", "els => els.map(e => e.dataset.node)"))
    links = page.eval_on_selector_all("svg#graph path[data-src]",
                                      "els => els.map(e => [e.getAttribute('class'), e.dataset.src, e.dataset.dst])")
    return nodes, {tuple(link) for link in links}


def planned(plan_path: str) -> tuple[set[str], set[tuple[str, str, str]]]:
    """What the plan says the page must draw, straight from the plan's own lists."""
    p = load_plan(plan_path)
    links = {("edge", e.src_node, e.dst_node) for e in p.edges}
    links |= {("stream", s.src_node, s.dst_node) for s in p.streams}
    links |= {("carry", c.src_node, c.dst_node) for w in p.walks for op in w.program for c in getattr(op, "carries", [])}
    return {n.name for n in p.nodes}, links


def node_data(page: Any, node: str, key: str) -> int:
    return int(page.get_attribute(f"svg#graph g.node[data-node='{node}']", f"data-{key}"))


def max_running(page: Any, node: str) -> int:
    return int(page.evaluate(f"window.seen.maxRunning[{node!r}] || 0"))


def was_lit(page: Any, node: str, mark: str = "lit") -> bool:
    return bool(page.evaluate(f"window.seen.{mark}[{node!r}] || false"))


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    out = tmp_path / f"{name}.png"
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 10_000
    return out
