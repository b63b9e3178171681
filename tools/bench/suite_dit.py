"""dit: Z-Image text-to-image, mstar-run's /v1/images/generations vs diffusers' ZImagePipeline.

Both sides run the same weights: transformers' Qwen3Model and diffusers' ZImageTransformer2DModel and
AutoencoderKL at graphs/zimage.yaml's bench-mid dims (a 4-layer width-512 text encoder, a 6 + 2-block
width-512 DiT, the tiny VAE), seeded random, fp32 (bench.zimage_reference). mstar-run serves the graph's
turbo mapping at those dims from the parts written in the published layout (`--weights ROOT`) and answers
the `openai` client; the reference calls ZImagePipeline in this process as its docs do, its prompts
encoded as the pipeline encodes them (padded to its 512-token max_sequence_length under a mask; the
prompt_embeds it is then handed are those rows), N images of one size as one call (its own batching:
one generator per image). Before timing, both sides' images of each case are checked equal (at most one
uint8 level apart on under 1 % of the pixels). Figures: images per minute for N images of SIZE x SIZE
requested at once, N = 1 and 4, STEPS steps each; the same N = 4 with mstar's step batching off (the
DiT node's `batch: 1`, each request's step its own call) as the baseline; and the mean latency of 4
requests arriving ARRIVAL_S apart: mstar-run runs each from its arrival, its steps joining the DiT calls
of those still denoising; the reference batches whatever has arrived each time it is free (a queue in
front of the pipeline: a running pipeline call takes no new image), its clock simulated from each call's
measured time.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import time

import yaml

from bench.peer_mstar import compile_plan
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import HIGHER, LOWER

CONCURRENCY, QUICK_CONCURRENCY = (1, 4), (1, 2)
SIZE, STEPS = 256, 9                # Z-Image-Turbo's 9 steps
ARRIVAL_S, ARRIVALS = 1.0, 4
MAX_SEQUENCE = 512                  # the pipeline's max_sequence_length
MODEL = "z-image-turbo"
PROMPTS = ["a lighthouse on a cliff at dusk, oil painting", "two cats asleep on a red sofa",
           "a bowl of green pears on a wooden table", "rain over a neon city street at night",
           "a paper boat on a pond", "mountains under the milky way"]
MSTAR = ("mstar-run /v1/images/generations (graphs/zimage.yaml at bench-mid dims, fp32): the prompt encoded once, "
         "each DiT step a Run the conductor batches across requests at any step, then the VAE")
REFERENCE = ("diffusers 0.42 ZImagePipeline in process, fp32 (transformers 5.25 Qwen3Model text encoder, prompts "
             "padded to 512 tokens as the pipeline pads them): the N images as one call")


def _dims() -> dict:
    from mstar_compiler.catalogue.bagel import KINDS as BAGEL
    from mstar_compiler.catalogue.zimage import ENCODER_PRESETS, PRESETS
    vae = next(k for k in BAGEL if k.kind == "vae_decoder").presets["tiny"]
    return {"text_enc": ENCODER_PRESETS["bench-mid"], "dit": PRESETS["bench-mid"], "vae_dec": vae}


def _write(ctx: Context):
    """The reference parts, their published-layout directory under ROOT, and the bench graphs (step
    batching on and off)."""
    import torch

    from bench.zimage_reference import Reference

    ref = Reference(_dims(), dit_scale=0.02)
    root = ctx.root / "bench-results/weights/zimage-bench-mid-random"
    if root.exists():
        import shutil
        shutil.rmtree(root)
    ref.write_repository(root)
    data = yaml.safe_load((ctx.root / "graphs/zimage.yaml").read_text())
    mid = data["presets"]["bench-mid"]
    data["presets"]["bench"] = {**mid, "random_weights": False, "weights": data["presets"]["turbo"]["weights"]}
    graphs = {}
    for name, dit_batch in (("on", 8), ("off", 1)):
        variant = {**data, "nodes": {**data["nodes"], "dit": {**data["nodes"]["dit"], "batch": dit_batch}}}
        graph = ctx.root / f"bench-results/plans/zimage-bench-{name}.yaml"
        graph.parent.mkdir(parents=True, exist_ok=True)
        graph.write_text(yaml.safe_dump(variant, sort_keys=False))
        graphs[name] = graph
    torch.set_grad_enabled(False)
    return ref, root, graphs


def _decode(b64: str):
    import numpy as np
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def _mstar(url: str, jobs: list[tuple[str, int]], delays: list[float] | None = None):
    """The images of (prompt, seed) jobs, job i sent after delays[i] s (all at once without); with delays
    also each one's seconds from its sending to its answer."""
    import openai

    async def run() -> list:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
        start = time.perf_counter()

        async def one(i: int, prompt: str, seed: int):
            delay = delays[i] if delays else 0.0
            await asyncio.sleep(delay)
            out = await client.images.generate(model=MODEL, prompt=prompt, size=f"{SIZE}x{SIZE}",
                                               response_format="b64_json", extra_body={"seed": seed, "steps": STEPS})
            return out.data[0].b64_json, time.perf_counter() - start - delay
        return await asyncio.gather(*(one(i, p, s) for i, (p, s) in enumerate(jobs)))
    return asyncio.run(run())


def _reference(ref, jobs: list[tuple[str, int]]):
    return ref.images([ref.prompt_ids(p) for p, _ in jobs], [s for _, s in jobs], SIZE, SIZE, STEPS,
                      padded_to=MAX_SEQUENCE, batched=True)


def _reference_arrivals(ref, jobs) -> dict[str, float]:
    """The arrivals served by a queue that runs every arrived job as one pipeline call each time it is free."""
    now, done, waits = 0.0, 0, []
    while done < len(jobs):
        now = max(now, done * ARRIVAL_S)
        ready = [i for i in range(done, len(jobs)) if i * ARRIVAL_S <= now]
        start = time.perf_counter()
        _reference(ref, [jobs[i] for i in ready])
        now += time.perf_counter() - start
        waits += [now - i * ARRIVAL_S for i in ready]
        done += len(ready)
    return {"latency": sum(waits) / len(waits)}


def _check_equal(mine: list, theirs: list, case: str) -> None:
    import numpy as np
    for got, want in zip(mine, theirs):
        diff = np.abs(_decode(got).astype(np.int16) - want.astype(np.int16))
        # fp32 reductions in another order (batched, padded: reassociation) flip a level near its edge
        if diff.max() > 1 or (diff > 0).mean() >= 0.01:
            raise AssertionError(f"{case}: mstar's and diffusers' images differ (max {diff.max()} levels, "
                                 f"{(diff > 0).mean():.2%} of pixels)")


def _per_minute(fn, n: int) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"rate": 60.0 * n / (time.perf_counter() - start)}


@register("dit", "Z-Image DiT (bench-mid) text-to-image: mstar-run vs diffusers' ZImagePipeline, 1 and 4 at once")
def run(ctx: Context) -> list[Row]:
    import importlib.util
    if importlib.util.find_spec("diffusers") is None:
        raise Needs("diffusers (ZImagePipeline), the reference side")
    import torch
    ref, root, graphs = _write(ctx)
    plans = {name: compile_plan(g, ctx.root / f"bench-results/plans/zimage-{name}.plan.bin", "--preset", "bench")
             for name, g in graphs.items()}
    levels = QUICK_CONCURRENCY if ctx.quick else CONCURRENCY
    ctx.settings.update(concurrency=list(levels), size=SIZE, steps=STEPS, arrivals=ARRIVALS, arrival_s=ARRIVAL_S,
                        dims="bench-mid", dtype="fp32", reference_torch_threads=torch.get_num_threads(),
                        weights=str(root))
    rows = []
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(mstar_run(plan, ctx.root / f"bench-results/logs/mstar-dit-{name}.log",
                                                       f"mstar-run (zimage, step batching {name})", ctx.threads,
                                                       "--weights", str(root)))
                   for name, plan in plans.items()}
        on, off = servers["on"].url, servers["off"].url
        for n in levels:
            jobs = [(PROMPTS[i], 10 + i) for i in range(n)]
            mine = [b64 for b64, _ in _mstar(on, jobs)]
            _check_equal(mine, _reference(ref, jobs), f"N={n}")
            sides = {"mstar": lambda: _per_minute(lambda: _mstar(on, jobs), n),
                     "diffusers": lambda: _per_minute(lambda: _reference(ref, jobs), n)}
            if n > 1:
                sides["mstar, step batching off"] = lambda: _per_minute(lambda: _mstar(off, jobs), n)
            samples = ctx.alternate(f"dit N={n}", sides, warmup=0)   # the agreement check ran both once
            rows.append(Row(f"z-image bench-mid {n} at once", "images per minute", "img/min", HIGHER,
                            Side(MSTAR, samples["mstar"]["rate"]), Side(REFERENCE, samples["diffusers"]["rate"]),
                            None, plot="dit-rate-vs-concurrency", x=n, xlabel="images requested at once",
                            note=f"{SIZE}x{SIZE}, {STEPS} steps, fp32; images equal"))
            if n > 1:
                rows.append(Row(f"z-image bench-mid {n} at once, step batching", "images per minute", "img/min",
                                HIGHER, Side(MSTAR, samples["mstar"]["rate"]),
                                Side("the same server with the DiT node's batch: 1 (each request's step its own "
                                     "call)", samples["mstar, step batching off"]["rate"]), None,
                                names=("batching on", "batching off"),
                                note=f"{SIZE}x{SIZE}, {STEPS} steps, fp32"))
        jobs = [(PROMPTS[i], 20 + i) for i in range(ARRIVALS)]
        delays = [i * ARRIVAL_S for i in range(ARRIVALS)]

        def mstar_arrivals() -> dict[str, float]:
            waits = [w for _, w in _mstar(on, jobs, delays)]
            return {"latency": sum(waits) / len(waits)}
        samples = ctx.alternate(f"dit arrivals every {ARRIVAL_S:g} s", {
            "mstar": mstar_arrivals, "diffusers": lambda: _reference_arrivals(ref, jobs)}, warmup=0)
        rows.append(Row(f"z-image bench-mid {ARRIVALS} arriving {ARRIVAL_S:g} s apart", "mean latency", "s", LOWER,
                        Side(MSTAR, samples["mstar"]["latency"]),
                        Side(REFERENCE + "; a queue running every arrived request as one call when free (its clock "
                             "simulated from measured call times)", samples["diffusers"]["latency"]), None,
                        note=f"{SIZE}x{SIZE}, {STEPS} steps, fp32"))
    return rows
