"""cfg: BAGEL text-to-image denoising, CFG branches batched vs sequential; placement.

Part 1, in this process on the same random weights of a `bagel_mot_lm` sized so that
compute matters on a CPU (its `bench-mid` preset; tiny is overhead-bound, bagel-7b does
not fit a 2-core machine): one request's denoising steps, each step predicting the velocity
of the full-condition, text-dropped and image-dropped branches and taking the guided
Euler step.
  mstar:    the 3 GEN segments packed into ONE forward + the `cfg_combine` component
  baseline: three forwards, one per branch, + the unfused combine (the torch reference
            `cfg_euler_step_reference`), as a stage pipeline without cross-branch batching
On CPU `cfg_combine` itself runs that same torch reference (its fused Triton kernel is
CUDA-only), so here only the batching differs. Both sides are checked to reach the
same latent before timing.

Part 2, served: graphs/bagel.yaml's `bench-mid` preset (the same LM dims, seeded random
weights) behind two real `mstar-run` servers, one per placement, sent the same T2I requests
(fixed prompts, seeds, size and steps) over HTTP /v1/images/generations at concurrency 1
and 4; p50 end-to-end seconds per image.
  cfg_parallel: 3 worker processes (llm, llm_cfg_text, llm_cfg_img), one CFG branch each,
                velocities sent worker to worker
  single:       1 worker process, the CFG branches (of all requests) batched in one forward
Both servers split the cores as mstar-run does by default (each local worker gets an
equal share: on a 2-core machine `single`'s worker runs 2 torch threads, each of
`cfg_parallel`'s three runs 1), so each placement may use the whole machine. T2I is run as BAGEL runs it (cfg_img_scale 1): only the
full and text-dropped branches run, so rank 2 idles while denoising. Both servers are
checked to return the same image size (and their max pixel difference is noted) first.
"""
from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

from bench.image_load import ImageJob, generate_images, pixels
from bench.openai_load import model_card
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import Server, mstar_run
from bench.stats import HIGHER, LOWER
from bench.peer_mstar import compile_plan

# bagel_mot_lm's (and graphs/bagel.yaml's) `bench-mid` preset: Qwen2-style MoT LM, 6 layers of
# width 512, up to 256 latent tokens per image (32x32 latent)
PRESET = "bench-mid"
LATENT_SIDE, QUICK_LATENT_SIDE = 32, 16   # latent (16, side, side): (side/2)^2 tokens
PROMPT_TOKENS, STEPS = 32, 8
MSTAR = "3 CFG branches packed into one bagel_mot_lm forward + cfg_combine component"
BASELINE = "3 sequential bagel_mot_lm forwards (one per branch) + unfused torch combine"
ANCHOR = 1.25  # the M* paper's BAGEL T2I p50 E2E gain over single-stage vLLM-Omni (not the same pair of sides)

VAE_SCALE = 8                   # image pixels per latent cell: 256 x 256 images (quick: 128 x 128)
CONCURRENCY = (1, 4)
MAX_PIXEL_DIFF = 4              # float reassociation across placements flips a level or so (measured: 1)
JOBS = (ImageJob("a red cube on a wooden table", 11), ImageJob("a lighthouse at dusk, oil painting", 12),
        ImageJob("a bowl of lemons, studio photo", 13), ImageJob("a snowy mountain village at night", 14))
PLACEMENTS = {"cfg_parallel": "mstar-run cfg_parallel: 3 worker processes, one CFG branch each "
                              "(llm, llm_cfg_text, llm_cfg_img), velocities sent worker to worker",
              "single": "mstar-run single: 1 worker process, the CFG branches batched in one forward"}


class _Branches:
    """One request's three KV sequences (full, text-dropped, image-dropped) over one paged cache."""

    def __init__(self, model, prompt_tokens: int) -> None:
        import torch
        from runtime.models.bagel.segments import Segment, SegmentKind
        from runtime.model_executor.kv import KVBlockManager

        self.model, self.Segment, self.GEN = model, Segment, SegmentKind.GEN
        self.cache = model.make_kv_cache(64, 16)
        blocks = KVBlockManager(64, 16)
        ids = torch.randint(0, 400, (prompt_tokens,), generator=torch.Generator().manual_seed(1))
        self.context: dict[str, tuple[int, int, tuple[int, ...]]] = {"cfg_text": (0, 0, ())}
        for seq in ("full", "cfg_img"):  # text-to-image: dropping the (absent) image keeps the text
            blocks.allocate(seq, 0)
            probe = Segment(SegmentKind.TEXT, 0, 0, tokens=ids)
            self.cache.copy_blocks(blocks.append(seq, probe.num_rows(model.patch)))
            table = tuple(blocks.table(seq).blocks)
            (ctx_len, rope), = model([Segment(SegmentKind.TEXT, 0, 0, table, tokens=ids)], self.cache).states
            self.context[seq] = (ctx_len, rope, table)

    def gen(self, seq: str, latent, t: float):
        ctx_len, rope, table = self.context[seq]
        return self.Segment(self.GEN, ctx_len, rope, table, latent=latent, timestep=t)

    def velocities(self, latent, t: float, batched: bool) -> list:
        segs = [self.gen(s, latent, t) for s in ("full", "cfg_text", "cfg_img")]
        if batched:
            return self.model(segs, self.cache).outputs
        return [self.model([s], self.cache).outputs[0] for s in segs]


def _build(quick: bool):
    try:
        import torch
        from mstar_compiler.catalogue import load_catalogue
        from runtime.model_executor.components import component_class
    except ImportError as exc:
        raise Needs(f"BAGEL's components (bagel_mot_lm, cfg_combine): {exc}") from exc
    cat, dims = load_catalogue(), _lm_dims()
    torch.manual_seed(0)
    try:
        model = component_class("bagel_mot_lm")(dims, {"seed": 0}).eval()
        combine = component_class("cfg_combine")(cat["cfg_combine"].presets["tiny"], dict(cat["cfg_combine"].args))
    except KeyError as exc:
        raise Needs(f"BAGEL's components: {exc}") from exc
    side = QUICK_LATENT_SIDE if quick else LATENT_SIDE
    latent = torch.randn(dims["latent_channels"], side, side, generator=torch.Generator().manual_seed(2))
    return model, combine, latent, dims


def _lm_dims() -> dict:
    from mstar_compiler.catalogue import load_catalogue
    presets = load_catalogue()["bagel_mot_lm"].presets
    if PRESET not in presets:
        raise Needs(f"bagel_mot_lm's `{PRESET}` preset in mstar_compiler/catalogue/bagel.py")
    return dict(presets[PRESET])


@functools.cache
def _defaults() -> dict:
    """BAGEL's request param defaults, from graphs/bagel.yaml (the one place they are written)."""
    from mstar_compiler.pipeline import compile_file
    plan = compile_file(str(Path(__file__).resolve().parents[2] / "graphs" / "bagel.yaml")).plan
    return {p.name: p.default for p in plan.params}


def _scales() -> tuple[float, float]:
    return float(_defaults()["cfg_text_scale"]), float(_defaults()["cfg_img_scale"])


def _times(steps: int) -> list[float]:
    from runtime.models.bagel.flow import flow_timesteps
    return [float(t) for t in flow_timesteps(steps + 1, shift=float(_defaults()["timestep_shift"]))]


def _denoise_batched(branches: _Branches, combine, x, times: list[float]):
    from runtime.models.bagel.cfg_combine import CfgRequest
    for t, t_next in zip(times[:-1], times[1:]):
        v_full, v_text, v_img = branches.velocities(x, t, batched=True)
        x, = combine([CfgRequest(x, v_full, v_text, v_img, t, t_next, *_scales())])
    return x


def _denoise_sequential(branches: _Branches, combine, x, times: list[float]):
    import torch
    from runtime.models.bagel.cfg_kernel import Guidance, cfg_euler_step_reference
    guidance = Guidance.uniform(1, combine.text_scale, combine.img_scale, combine.cfg_interval)
    for t, t_next in zip(times[:-1], times[1:]):
        v_full, v_text, v_img = branches.velocities(x, t, batched=False)
        x = cfg_euler_step_reference(x[None], v_full[None], v_text[None], v_img[None], torch.tensor([t]),
                                     torch.tensor([t_next]), guidance, renorm_type=combine.renorm_type,
                                     renorm_min=combine.renorm_min, patch_size=combine.patch)[0]
    return x


def _timed(fn) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"time": time.perf_counter() - start}


def _branches_row(ctx: Context) -> Row:
    import torch
    model, combine, latent, dims = _build(ctx.quick)
    with torch.inference_mode():
        branches, times = _Branches(model, PROMPT_TOKENS), _times(STEPS)
        diff = (_denoise_batched(branches, combine, latent, times)
                - _denoise_sequential(branches, combine, latent, times)).abs().max().item()
        if diff > 1e-3:
            raise AssertionError(f"batched and sequential CFG denoising differ by {diff:.2e}")
        samples = ctx.alternate("cfg branches", {
            "mstar": lambda: _timed(lambda: _denoise_batched(branches, combine, latent, times)),
            "baseline": lambda: _timed(lambda: _denoise_sequential(branches, combine, latent, times))},
            warmup=0)  # the agreement check above already ran both sides once
    tokens = (latent.shape[1] // 2) * (latent.shape[2] // 2)
    case = f"{STEPS} steps, {tokens} latent tokens"
    return Row(case, "denoising time", "s", LOWER, Side(MSTAR, samples["mstar"]["time"]),
               Side(BASELINE, samples["baseline"]["time"]), ANCHOR, plot="branches", x="3 CFG branches",
               note=f"bagel_mot_lm {dims['num_hidden_layers']} layers x {dims['hidden_size']}, prompt "
                    f"{PROMPT_TOKENS} tokens; max |diff| {diff:.1e}; on CPU both combines are the torch reference")


def _placement_server(ctx: Context, placement: str) -> Server:
    """mstar-run on graphs/bagel.yaml's bench-mid preset; its workers share the cores as mstar-run splits them."""
    plans, logs = ctx.root / "bench-results/plans", ctx.root / "bench-results/logs"
    plan = compile_plan(ctx.root / "graphs/bagel.yaml", plans / f"bagel-{PRESET}-{placement}.plan.bin",
                        "--preset", PRESET, "--placement", placement)
    return mstar_run(plan, logs / f"bagel-{placement}.log", f"mstar-run bagel {placement}")


def _agreement(servers: dict[str, Server], model: str, extra: dict) -> str:
    """Both placements draw the first job (a warm-up too): same image size; the max pixel difference."""
    for name, srv in servers.items():
        said = model_card(srv.url).get("placement")
        if said != name:
            raise AssertionError(f"the {name} server says its placement is {said!r}")
    a, b = (pixels(generate_images(srv.url, model, JOBS[:1], extra, 1).pngs[0]) for srv in servers.values())
    if a.shape != b.shape:
        raise AssertionError(f"the placements return images of shapes {a.shape} and {b.shape}")
    if a.std() < 1:
        raise AssertionError("the served image is flat: no image was drawn")
    diff = int(abs(a - b).max())
    if diff > MAX_PIXEL_DIFF:
        raise AssertionError(f"the placements draw different images (max pixel diff {diff}): not the same work")
    return f"both {a.shape[1]}x{a.shape[0]}, max pixel diff {diff}"


def _placement_rows(ctx: Context) -> list[Row]:
    from runtime.ranks.workers import threads_per_local_worker
    ctx.settings["worker_threads"] = {"single": threads_per_local_worker(1), "cfg_parallel": threads_per_local_worker(3)}
    side = VAE_SCALE * (QUICK_LATENT_SIDE if ctx.quick else LATENT_SIDE)
    extra = {"size": f"{side}x{side}", "steps": STEPS + 1}  # STEPS + 1 timesteps: STEPS Euler steps
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(_placement_server(ctx, name)) for name in PLACEMENTS}
        model = model_card(servers["single"].url)["id"]
        check = _agreement(servers, model, extra)
        samples = {c: ctx.alternate(f"cfg placements c={c}", {
            name: (lambda url=srv.url, c=c: generate_images(url, model, JOBS, extra, c).metrics())
            for name, srv in servers.items()}, warmup=0) for c in CONCURRENCY}  # _agreement warmed both
    dims = _lm_dims()
    note = (f"{PRESET}: bagel_mot_lm {dims['num_hidden_layers']} layers x {dims['hidden_size']}; "
            f"{len(JOBS)} requests, {STEPS} steps, BAGEL T2I (cfg_img_scale 1: 2 branches run, rank 2 idles); "
            f"mstar-run's default threads: cores // local workers ({threads_per_local_worker(1)} for single's "
            f"worker, {threads_per_local_worker(3)} for each of cfg_parallel's 3); {check}")
    rows = []
    for c in CONCURRENCY:
        for key, metric, unit, better in (("p50_e2e", "p50 E2E per image", "s", LOWER),
                                          ("img_s", "images per second", "img/s", HIGHER)):
            rows.append(Row(f"{side}x{side}, {STEPS} steps, concurrency {c}", metric, unit, better,
                            Side(PLACEMENTS["cfg_parallel"], samples[c]["cfg_parallel"][key]),
                            Side(PLACEMENTS["single"], samples[c]["single"][key]), plot=f"placement-{key}", x=c,
                            xlabel="concurrent requests", names=("cfg_parallel", "single"), note=note))
    return rows


@register("cfg", "BAGEL T2I: 3 CFG branches in one forward + cfg_combine vs 3 sequential forwards + "
                 "unfused combine; served cfg_parallel (3 ranks) vs single placement")
def run(ctx: Context) -> list[Row]:
    ctx.settings.update(dims=_lm_dims(), steps=STEPS, prompt_tokens=PROMPT_TOKENS,
                        latent_side=QUICK_LATENT_SIDE if ctx.quick else LATENT_SIDE, served_preset=PRESET,
                        concurrency=list(CONCURRENCY), requests=len(JOBS))
    rows = [_branches_row(ctx)]
    try:
        rows += _placement_rows(ctx)
    except Needs as exc:
        ctx.record_needs("cfg_parallel vs single placement (served)", exc)
    return rows
