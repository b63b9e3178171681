"""The bagel-wide suite's parts at CI size: the repository it writes is the published layout at the cut (checked
against the published listing, and by `mstar-run check-weights`), the upstream process computes what mstar-run
serves (on a tiny plan with the published mappings, fp32 on both sides: the same images and the same answer), and
the rows."""
from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from bench import bagel_wide_weights as weights
from bench.registry import Context
from bench.stats import round_ratios
from bench.suite_bagel_wide import (NODES, QUESTION, BagelSide, Mstar, Upstream, _rows, data_url, fresh_picture,
                                    words)
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.text.loading import load_tokenizer
from tests.runtime.serving.published_layouts import PRESET, published_preset
from tests.runtime.weights.published_layouts import repository

ROOT = Path(__file__).resolve().parents[2]


def _plan(tmp: Path, graph: Path, preset: str) -> Path:
    path = tmp / "plan.bin"
    path.write_bytes(compile_file(str(graph), Options(preset=preset)).data)
    return path


def test_the_repository_holds_the_published_tensors_of_the_cut(tmp_path: Path) -> None:
    """Every name and shape the suite writes at `bagel-wide` is the published repository's, LM layers past 8 left
    out (the listing was rebuilt from BAGEL's configs and code, not from mstar's modules)."""
    nodes = weights.plan_nodes(_plan(tmp_path, ROOT / "graphs/bagel.yaml", "bagel-wide"))
    published = repository("bagel-7b-mot")

    def kept(name: str) -> bool:
        layer = re.match(r"language_model\.model\.layers\.(\d+)\.", name)
        return layer is None or int(layer.group(1)) < 8
    for file, ours in (("ema.safetensors", weights.ema_shapes(nodes)), ("ae.safetensors", weights.ae_shapes(nodes))):
        want = {name: shape for name, shape in published[file].items() if kept(name)}
        assert {name: shape for name, (shape, _) in ours.items()} == want, file
    ema, ae = weights.ema_shapes(nodes), weights.ae_shapes(nodes)
    assert sum(math.prod(s) for s, _ in [*ema.values(), *ae.values()]) == 5_368_757_891
    assert ema[weights.POS_EMBED][1] == weights.SINCOS and ema["language_model.model.norm.weight"][1] == weights.ONES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """A tiny fp32 plan with the published mappings, and the suite's repository written for it."""
    tmp = tmp_path_factory.mktemp("bagel-wide")
    plan = _plan(tmp, published_preset(tmp, "bagel", "bagel-7b"), PRESET)
    ctx = Context(rounds=1, quick=True, root=tmp)
    files = weights.ensure(ctx, plan, words())
    return ctx, plan, files


def test_mstar_run_checks_the_written_repository(tiny) -> None:
    ctx, plan, files = tiny
    stamp = (files.repo / "mstar-bench-recipe.json").stat().st_mtime_ns
    assert weights.ensure(ctx, plan, words()) == files                       # unchanged: not rewritten
    assert (files.repo / "mstar-bench-recipe.json").stat().st_mtime_ns == stamp
    got = subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "check-weights", "--weights",
                          str(files.root), str(plan)], capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0 and "all weights match" in got.stdout, got.stdout + got.stderr


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def test_the_upstream_loop_draws_and_answers_as_mstar_run_serves(tiny) -> None:
    """The same requests through mstar-run and through the upstream process, both in fp32 on the same files: the
    T2I and I2I images within one uint8 level (test_published_bagel.py's tolerance: summation order differs,
    paged vs dense attention, fused CFG step, conv algorithms), the I2T answer the same words."""
    ctx, plan, files = tiny
    prompt, seed, question = "n1 n2 " + " ".join(words()[:6]), 7, f"n3 {QUESTION}"
    picture = fresh_picture(3, 64)
    with contextlib.ExitStack() as stack:
        mstar = Mstar(ctx, plan, files)
        mstar.start(stack)
        t2i, i2i = mstar.t2i(prompt, seed, 32, 4)[1], mstar.i2i(prompt, seed, picture, 4)[1]
        client = openai.OpenAI(base_url=f"{mstar.peer.server.url}/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model=mstar.peer.model, max_tokens=5, temperature=0.0, extra_body={"ignore_eos": True},
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(picture)}},
                                                   {"type": "text", "text": question}]}])
    with contextlib.ExitStack() as stack:
        upstream = Upstream(ctx, plan, files, dtype="float32")
        upstream.start(stack)
        assert upstream.record["dtype"] == "float32"
        up_t2i, up_i2i = upstream.t2i(prompt, seed, 32, 4)[1], upstream.i2i(prompt, seed, picture, 4)[1]
        got = upstream.answers([(question, picture)], 5)[1]
    # the edit keeps its input's size: BAGEL's VAE resize, capped by the tiny LM's latent grid, leaves 64 x 64
    for ours, theirs, shape in ((t2i, up_t2i, (32, 32, 3)), (i2i, up_i2i, (64, 64, 3))):
        a, b = _pixels(ours), _pixels(theirs)
        assert a.shape == b.shape == shape
        assert len(np.unique(b)) > 20                                  # a picture, not a clamped flat field
        assert np.abs(a - b).max() <= 1 and (a != b).mean() < 0.01     # fp32 both sides, other summation orders
    words_back = load_tokenizer(files.repo).decode(got["tokens"][0])
    assert len(got["tokens"][0]) == 5 and answer.choices[0].message.content.split() == words_back.split()


def test_rows_pair_the_sides_and_add_mstars_nodes(tmp_path: Path) -> None:
    ctx = Context(rounds=2, quick=False, root=tmp_path)
    sides = {name: BagelSide(ctx, name) for name in ("mstar", "upstream")}
    for name, side in sides.items():
        side.record = {"label": name, "cache_enabled": False, "cache_source": "test"}
    keys = ["start_s", "peak_rss_gib", "t2i_s", "i2i_s", "cache_query_tokens", "cache_hit_tokens"]
    keys += [f"node_s_{node}" for node in NODES] + [f"i2t_{k}_{n}" for n in (1, 16) for k in ("tok_s", "p50_e2e")]
    samples = {"mstar": {k: [2.0, 2.0] for k in keys}, "upstream": {k: [3.0, 3.0] for k in keys}}
    for side in samples.values():
        side["cache_query_tokens"] = side["cache_hit_tokens"] = [0, 0]
    rows = _rows(ctx, samples, sides)
    assert len(rows) == 2 + 2 + len(NODES) + 2 * 2
    t2i = next(r for r in rows if r.case.startswith("BAGEL wide T2I, 512 x 512, 25 timesteps"))
    assert round_ratios(t2i.a.samples, t2i.b.samples, t2i.better) == [1.5, 1.5]
    tok_s = next(r for r in rows if r.case == "BAGEL wide I2T, 16 concurrent" and r.metric == "tokens per second")
    assert round_ratios(tok_s.a.samples, tok_s.b.samples, tok_s.better) == [2 / 3, 2 / 3]
    assert all(r.b is None for r in rows if "worker time per node" in r.case)
    json.dumps([r.to_dict() for r in rows])
