"""The pages of BAGEL, Orpheus and V-JEPA 2-AC tiny servers in headless Chromium: the graph as
planned, an image, a speech and a rollout request from the playground, the node counters moving."""
from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from tests.runtime.serving.conftest import compile_plan
from tests.runtime.serving.page.conftest import drawn, node_data, open_page, planned, screenshot, serve, was_lit


@pytest.fixture(scope="module")
def bagel_plan(plan_dir) -> str:
    return compile_plan(plan_dir, "bagel", preset="tiny", placement="single")


@pytest.fixture(scope="module")
def orpheus_plan(plan_dir) -> str:
    return compile_plan(plan_dir, "orpheus", preset="tiny", placement="single")


def _wait_batches(page, node: str, before: int) -> None:
    page.wait_for_function(f"document.querySelector(\"g.node[data-node='{node}']\").dataset.batches > {before}")


def test_image_from_the_playground(page, bagel_plan, tmp_path) -> None:
    srv_gen = serve(bagel_plan)
    srv = next(srv_gen)
    try:
        open_page(page, srv.url)
        assert drawn(page) == planned(bagel_plan)
        before = {n: node_data(page, n, "batches") for n in ("llm", "vae_dec")}
        size = page.eval_on_selector_all("#image-size option", "os => os.map(o => o.value)")[1]   # the 2nd size
        page.select_option("#image-size", size)
        page.fill("#image-steps", "3")
        page.click("#image-go")
        page.wait_for_selector("#image-output[data-done='1']", timeout=120_000)
        assert "error" not in page.text_content("#image-output")
        src = page.get_attribute("#image-result", "src")
        image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert f"{image.width}x{image.height}" == size
        for node, n in before.items():
            _wait_batches(page, node, n)
        assert was_lit(page, "llm") and was_lit(page, "vae_dec")   # ran within a feed period: lit up
        screenshot(page, tmp_path, "bagel")
    finally:
        next(srv_gen, None)


def test_speech_from_the_playground(page, orpheus_plan, tmp_path) -> None:
    srv_gen = serve(orpheus_plan)
    srv = next(srv_gen)
    try:
        open_page(page, srv.url)
        assert drawn(page) == planned(orpheus_plan)
        assert "sliding 28/7" in page.text_content("svg#graph text.stream-label")
        before = {n: node_data(page, n, "batches") for n in ("lm", "snac")}
        page.fill("#speech-max", "70")
        page.click("#speech-go")
        page.wait_for_selector("#speech-output[data-done='1']", timeout=120_000)
        assert "error" not in page.text_content("#speech-output")
        pcm_bytes = int(page.get_attribute("#speech-audio", "data-bytes"))
        wav = page.evaluate("async () => Array.from(new Uint8Array(await (await fetch("
                            "document.getElementById('speech-audio').src)).arrayBuffer()))")
        assert pcm_bytes > 0 and len(wav) == 44 + pcm_bytes and bytes(wav[:4]) == b"RIFF"
        for node, n in before.items():
            _wait_batches(page, node, n)
        # lit: the node ran since the page's previous update, read from its batch counter (a tiny
        # Orpheus request may start and end between two 4 Hz updates, so "seen running" is not asked)
        assert was_lit(page, "lm") and was_lit(page, "snac")
        assert page.evaluate("window.seen.maxBuffered.audio_tokens") > 0   # the stream edge held items
        screenshot(page, tmp_path, "orpheus")
    finally:
        next(srv_gen, None)


def test_rollout_from_the_playground(page, plan_dir, tmp_path) -> None:
    plan = compile_plan(plan_dir, "vjepa2_ac", preset="tiny")
    srv_gen = serve(plan)
    srv = next(srv_gen)
    try:
        open_page(page, srv.url)
        assert drawn(page) == planned(plan)
        before = node_data(page, "predictor", "batches")
        page.fill("#rollout-horizon", "3")
        page.click("#rollout-go")
        page.wait_for_selector("#rollout-output[data-done='1']", timeout=120_000)
        assert page.text_content("#rollout-output").startswith("3 frame(s) of ")
        assert page.eval_on_selector_all("#rollout-plot polyline", "els => els[0].getAttribute('points')").count(",") == 3
        _wait_batches(page, "predictor", before)
        assert was_lit(page, "encoder") and was_lit(page, "predictor")
        screenshot(page, tmp_path, "vjepa2")
    finally:
        next(srv_gen, None)


def test_qwen3_omni_split_page_draws_both_ranks_and_streams(page, plan_dir, tmp_path) -> None:
    plan = compile_plan(plan_dir, "qwen3_omni", preset="tiny", placement="thinker_talker")
    srv_gen = serve(plan)
    srv = next(srv_gen)
    try:
        open_page(page, srv.url)
        assert drawn(page) == planned(plan)
        assert page.eval_on_selector_all("svg#graph g.band", "els => els.map(e => e.dataset.rank)") == ["0", "1"]
        assert page.is_visible("#chat-send") and page.is_visible("#speech-go") and not page.query_selector("#image-go")
        page.fill("#chat-max", "4")
        page.click("#chat-send")
        page.wait_for_selector("#chat-output[data-done='1']", timeout=120_000)
        assert "error" not in page.text_content("#chat-output")
        screenshot(page, tmp_path, "qwen3_omni")
    finally:
        next(srv_gen, None)
