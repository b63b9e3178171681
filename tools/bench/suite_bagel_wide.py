"""bagel-wide: BAGEL-7B-MoT at full width (8 of the LM's 28 MoT layers, the whole SigLIP ViT and FLUX VAE), mstar-run
vs BAGEL's upstream generation and understanding loops: T2I and I2I latency, I2T at 1 and 16 concurrent.

Both sides read the same repository (bench.bagel_wide_weights: ByteDance-Seed/BAGEL-7B-MoT's layout at
graphs/bagel.yaml's `bagel-wide` cut, bf16, seeded): mstar-run serves the preset with `--weights` through
`/v1/images/generations`, `/v1/images/edits` (a JSON body, the image as a data URL) and `/v1/chat/completions`
(an image part, then the question; streamed); the upstream loops run in a process of their own (bench.bagel_peer:
BAGEL's `interleave_inference`, `generate_image` with one forward per CFG branch per step and `gen_text`, restated
in plain torch, on the dense LM; SigLIP through transformers; the VAE through diffusers; nothing cached across
requests; one request at a time, as BAGEL's inferencer serves).

One measurement of a side starts it alone (the two do not fit 24 GiB together), warms up (a 64 x 64 two-step
T2I, a one-token I2T), then: one T2I at SIZE x SIZE with STEPS timesteps (BAGEL's text-to-image: cfg_text_scale 4,
no image branch, timestep_shift 3), one I2I edit of a SIZE x SIZE image (cfg_img_scale 2: three branches), and
I2T bursts of 1 and 16 concurrent requests (each a fresh image and question, TOKENS greedy tokens, eos ignored).
Every prompt starts with nonce words and every image is drawn anew; mstar's prefix cache is off (its counters show
it). Rows: latency of the T2I and the I2I (send to PNG back), I2T tokens per second over a burst and its median
latency, start to ready and peak RSS of the side's process, and mstar's worker time per node for the T2I.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import cache_state
from bench.bagel_wide_weights import BagelWide, ensure, plan_nodes
from bench.cache_state import COLD, CacheMismatch
from bench.line_process import LineProcess
from bench.openai_load import ChatJob, chat_burst
from bench.peer_mstar import compile_plan, kv_bytes, started_peer
from bench.peers import measured, no_cache, node_run_s
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import HIGHER, LOWER
from runtime.launch.server import peak_rss

SIZE, STEPS, TOKENS, CONCURRENCY = 512, 25, 8, (1, 16)
QUICK_SIZE, QUICK_STEPS, QUICK_TOKENS, QUICK_CONCURRENCY = 128, 3, 4, (1, 2)
T2I = {"cfg_text_scale": 4.0, "timestep_shift": 3.0}
I2I = {"cfg_text_scale": 4.0, "cfg_img_scale": 2.0, "timestep_shift": 3.0}
NODES = ("vit", "vae_enc", "llm", "cfg", "vae_dec")
NONCES = 64
SENTENCE = "a lighthouse on a cliff above a stormy sea at dusk"
QUESTION = "what does this picture show ?"
SERVER_METRICS = (("start_s", "start to ready (weights cached by the OS)", "s"),
                  ("peak_rss_gib", "peak RSS of its process", "GiB"))
LABELS = {"mstar": "mstar-run, graphs/bagel.yaml bagel-wide preset (bf16), --weights on the suite's repository",
          "upstream": ("BAGEL's interleave_inference / generate_image / gen_text restated in plain torch (bf16; "
                       "SigLIP via transformers, sdpa; VAE via diffusers), one request at a time, the same repository")}


def words() -> list[str]:
    return [*SENTENCE.split(), *QUESTION.split(), *(f"n{k}" for k in range(NONCES))]


def fresh_picture(seed: int, side: int) -> bytes:
    """A fresh PNG: smooth seeded colour fields (a 12 x 12 draw upsampled), unlike any other request's."""
    import torch
    import torch.nn.functional as F
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    field = F.interpolate(torch.rand(1, 3, 12, 12, generator=g), size=(side, side), mode="bicubic")[0]
    pixels = (field.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def vit_side(side: int) -> int:
    from runtime.models.bagel.image_io import VIT_RESIZE, target_size

    return target_size(side, side, VIT_RESIZE)[0]


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


class BagelSide:
    """One side's measurement: start alone, warm up, every case, stop."""

    def __init__(self, ctx: Context, name: str) -> None:
        self.ctx, self.name, self.jobs, self.record = ctx, name, 0, {}
        self.size, self.steps = (QUICK_SIZE, QUICK_STEPS) if ctx.quick else (SIZE, STEPS)
        self.tokens = QUICK_TOKENS if ctx.quick else TOKENS

    def fresh(self, text: str = SENTENCE) -> tuple[str, int]:
        """A new prompt (two nonce words, then `text`) and seed."""
        self.jobs += 1
        return f"n{self.jobs % NONCES} n{(self.jobs // NONCES) % NONCES} {text}", 1000 * self.jobs

    def __call__(self) -> dict[str, float]:
        with contextlib.ExitStack() as stack:
            t0 = time.perf_counter()
            self.start(stack)
            out = {"start_s": time.perf_counter() - t0}
            self.t2i(*self.fresh(), 64, 2)
            self.i2t(1, 1)
            out.update(measured(self.counters, self._cases)())
            out["peak_rss_gib"] = peak_rss(self.pid) / 2**30
            return out

    def _cases(self) -> dict[str, float]:
        before = self.node_s()
        out = {"t2i_s": self.t2i(*self.fresh(), self.size, self.steps)[0]}
        out.update({f"node_s_{node}": seconds - before[node] for node, seconds in self.node_s().items()})
        prompt, seed = self.fresh()
        out["i2i_s"] = self.i2i(prompt, seed, fresh_picture(seed, self.size), self.steps)[0]
        for n in (QUICK_CONCURRENCY if self.ctx.quick else CONCURRENCY):
            out.update({f"i2t_{k}_{n}": v for k, v in self.i2t(n, self.tokens).items()})
        return out

    def i2t_jobs(self, n: int) -> list[tuple[str, bytes]]:
        """n fresh questions, each with a fresh SIZE x SIZE picture."""
        return [(question, fresh_picture(seed, SIZE)) for question, seed in (self.fresh(QUESTION) for _ in range(n))]

    def node_s(self) -> dict[str, float]:
        return {}


class Mstar(BagelSide):
    def __init__(self, ctx: Context, plan: Path, files: BagelWide) -> None:
        super().__init__(ctx, "mstar")
        self.plan, self.flags = plan, ["--weights", str(files.root), "--no-prefix-cache"]

    def start(self, stack: contextlib.ExitStack) -> None:
        srv = stack.enter_context(mstar_run(self.plan, self.ctx.root / "bench-results/logs/mstar-bagel-wide.log",
                                            "mstar-run (bagel-wide)", self.ctx.threads, *self.flags))
        self.peer = started_peer(srv, LABELS["mstar"], self.flags, self.ctx.threads, kv_bytes(self.plan))
        self.record, self.pid, self.counters = self.peer.record(), srv.proc.pid, self.peer.counters

    def _image(self, path: str, body: dict[str, Any], side: int | None) -> tuple[float, bytes]:
        import aiohttp
        from PIL import Image

        async def post() -> tuple[float, dict]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
                start = time.perf_counter()
                async with session.post(self.peer.server.url + path, json=body) as resp:
                    data = await resp.json()
                    if resp.status != 200:
                        raise Needs(f"mstar-run {path}: HTTP {resp.status}: {data}")
                    return time.perf_counter() - start, data

        seconds, data = asyncio.run(post())
        png = base64.b64decode(data["data"][0]["b64_json"])
        size = Image.open(io.BytesIO(png)).size
        if side is not None and size != (side, side):
            raise Needs(f"mstar-run to draw {side} x {side}; got {size}")
        return seconds, png

    def t2i(self, prompt: str, seed: int, side: int, steps: int) -> tuple[float, bytes]:
        return self._image("/v1/images/generations", {"model": self.peer.model, "prompt": prompt, "seed": seed,
                                                      "size": f"{side}x{side}", "steps": steps, **T2I}, side)

    def i2i(self, prompt: str, seed: int, png: bytes, steps: int) -> tuple[float, bytes]:
        return self._image("/v1/images/edits", {"model": self.peer.model, "prompt": prompt, "seed": seed,
                                                "image": data_url(png), "steps": steps, **I2I}, None)

    def i2t(self, n: int, tokens: int) -> dict[str, float]:
        jobs = [ChatJob(q, tokens, image=data_url(png)) for q, png in self.i2t_jobs(n)]
        got = chat_burst(self.peer.server.url, self.peer.model, jobs)
        if any(c != tokens for c in got.completion_tokens):
            raise Needs(f"mstar to write {tokens} tokens per request; got {got.completion_tokens}")
        return {"tok_s": sum(got.completion_tokens) / got.wall_s, "p50_e2e": sorted(got.e2e_s)[len(got.e2e_s) // 2]}

    def node_s(self) -> dict[str, float]:
        return node_run_s(self.peer.server.url, NODES)


class Upstream(BagelSide):
    def __init__(self, ctx: Context, plan: Path, files: BagelWide, dtype: str | None = None) -> None:
        super().__init__(ctx, "upstream")
        self.dtype = dtype            # None: the repository's (bf16 here, as the plan's)
        from runtime.text.loading import load_tokenizer

        tokenizer = load_tokenizer(files.repo)
        # the ids mstar-run makes of the same text: the same tokenizer file through the same call
        self.ids = lambda text: tokenizer.encode(text, add_special_tokens=False)
        self.files, self.counters = files, no_cache
        self.dims = plan.with_suffix(".dims.json")
        nodes = plan_nodes(plan)
        self.dims.write_text(json.dumps({
            "llm": dict(nodes["llm"].dims), "vit": dict(nodes["vit"].dims), "cfg": dict(nodes["cfg"].args),
            "vae": {"dims": dict(nodes["vae_dec"].dims), "args": dict(nodes["vae_dec"].args)}}))

    def start(self, stack: contextlib.ExitStack) -> None:
        cmd = [sys.executable, "-m", "bench.bagel_peer", str(self.files.repo), str(self.dims)]
        if self.ctx.threads:
            cmd += ["--threads", str(self.ctx.threads)]
        if self.dtype:
            cmd += ["--dtype", self.dtype]
        tools = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tools), str(tools.parent)])}
        self.process = LineProcess(stack, cmd, self.ctx.root / "bench-results/logs/upstream-bagel-wide.log",
                                   "the upstream BAGEL process", env, tools.parent)
        ready = self.process.ask()
        self.pid = self.process.pid
        self.record = {"label": LABELS["upstream"], "cache_enabled": False,
                       "cache_source": "the upstream loop keeps nothing across requests", "torch_threads":
                       ready["threads"], "binding": "none", "attention": "einsum (LM), sdpa (SigLIP)",
                       "dtype": ready["dtype"]}

    def _timed(self, request: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        got = self.process.ask(request)
        return time.perf_counter() - start, got

    def _drawn(self, request: dict[str, Any]) -> tuple[float, bytes]:
        seconds, got = self._timed(request)
        return seconds, base64.b64decode(got["png"])

    def t2i(self, prompt: str, seed: int, side: int, steps: int) -> tuple[float, bytes]:
        return self._drawn({"task": "t2i", "ids": self.ids(prompt), "seed": seed, "width": side, "height": side,
                            "steps": steps, **T2I})

    def i2i(self, prompt: str, seed: int, png: bytes, steps: int) -> tuple[float, bytes]:
        return self._drawn({"task": "i2i", "ids": self.ids(prompt), "seed": seed, "steps": steps,
                            "image": base64.b64encode(png).decode(), **I2I})

    def answers(self, jobs: list[tuple[str, bytes]], tokens: int) -> tuple[float, dict[str, Any]]:
        """The upstream loop's I2T of (question, PNG) jobs, one after another: seconds, and its answer."""
        return self._timed({"task": "i2t", "tokens": tokens,
                            "jobs": [{"image": base64.b64encode(png).decode(), "ids": self.ids(q)} for q, png in jobs]})

    def i2t(self, n: int, tokens: int) -> dict[str, float]:
        wall, got = self.answers(self.i2t_jobs(n), tokens)
        return {"tok_s": n * tokens / wall, "p50_e2e": sorted(got["e2e"])[n // 2]}


def _rows(ctx: Context, samples: dict, sides: dict[str, BagelSide]) -> list[Row]:
    states = cache_state.side_states({name: side.record for name, side in sides.items()}, samples, ctx.settings)
    try:
        cache_state.require_same("mstar vs upstream", COLD, states)
    except CacheMismatch as exc:
        ctx.record_needs("mstar vs upstream", exc)
        return []
    a, b, names = samples["mstar"], samples["upstream"], ("mstar", "upstream")
    la, lb = sides["mstar"].record["label"], sides["upstream"].record["label"]
    side = sides["mstar"]
    rows = [Row("BAGEL wide, the server", metric, unit, LOWER, Side(la, a[key]), Side(lb, b[key]), names=names,
                note="each side started alone; the upstream loop in its own process; mstar's peak is its worker's")
            for key, metric, unit in SERVER_METRICS]
    gen = f"{side.size} x {side.size}, {side.steps} timesteps, one request"
    rows.append(Row(f"BAGEL wide T2I, {gen}", "latency (send to PNG)", "s", LOWER, Side(la, a["t2i_s"]),
                    Side(lb, b["t2i_s"]), names=names, note="cfg_text_scale 4, no image branch (BAGEL's T2I); "
                                                            "the text-dropped branch inside cfg_interval only"))
    rows.append(Row(f"BAGEL wide I2I, {gen}", "latency (send to PNG)", "s", LOWER, Side(la, a["i2i_s"]),
                    Side(lb, b["i2i_s"]), names=names, note="cfg_text_scale 4, cfg_img_scale 2: three branches"))
    for node in NODES:
        rows.append(Row("BAGEL wide T2I: mstar's worker time per node", f"{node} batches", "s", LOWER,
                        Side(la, a[f"node_s_{node}"]), names=("mstar", ""),
                        note="the sum of the node's batch run times over the T2I (/metrics mstar_batch_run_ms)"))
    for n in (QUICK_CONCURRENCY if ctx.quick else CONCURRENCY):
        note = (f"{n} concurrent request(s), a fresh {SIZE} x {SIZE} picture (the ViT reads it at BAGEL's "
                f"{vit_side(SIZE)} x {vit_side(SIZE)}) and question each, {side.tokens} tokens; the upstream loop "
                "answers one after another")
        for key, metric, unit, better in (("tok_s", "tokens per second", "tok/s", HIGHER),
                                          ("p50_e2e", "median latency", "s", LOWER)):
            rows.append(Row(f"BAGEL wide I2T, {n} concurrent", metric, unit, better, Side(la, a[f"i2t_{key}_{n}"]),
                            Side(lb, b[f"i2t_{key}_{n}"]), names=names, plot=f"i2t-{key}", x=n,
                            xlabel="concurrent requests", note=note))
    return rows


@register("bagel-wide", "BAGEL-7B-MoT at full width (8 of 28 layers): mstar-run vs BAGEL's upstream loops, T2I and "
                        "I2I latency, I2T at 1 and 16 concurrent")
def run(ctx: Context) -> list[Row]:
    plan = compile_plan(ctx.root / "graphs/bagel.yaml", ctx.root / "bench-results/plans/bagel-wide.plan.bin",
                        "--preset", "bagel-wide")
    files = ensure(ctx, plan, words())
    sides = {"mstar": Mstar(ctx, plan, files), "upstream": Upstream(ctx, plan, files)}
    ctx.settings.update(size=sides["mstar"].size, steps=sides["mstar"].steps, tokens=sides["mstar"].tokens,
                        concurrency=list(QUICK_CONCURRENCY if ctx.quick else CONCURRENCY), t2i=T2I, i2i=I2I,
                        weights=str(files.repo), kv_budget_bytes=kv_bytes(plan))
    samples = ctx.alternate("bagel-wide", sides, warmup=0)
    ctx.settings["sides"] = {name: side.record for name, side in sides.items()}
    return _rows(ctx, samples, sides)
