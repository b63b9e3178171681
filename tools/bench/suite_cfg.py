"""cfg: BAGEL text-to-image denoising, CFG branches batched vs sequential; placement.

Part 1, in this process on the same random weights of a `bagel_mot_lm` sized so that
compute matters on a CPU (BENCH_DIMS below; tiny is overhead-bound, bagel-7b does not
fit a 2-core machine): one request's denoising steps, each step predicting the velocity
of the full-condition, text-dropped and image-dropped branches and taking the guided
Euler step.
  mstar:    the 3 GEN segments packed into ONE forward + the `cfg_combine` component
  baseline: three forwards, one per branch, + the unfused combine (the torch reference
            `cfg_euler_step_reference`), as a stage pipeline without cross-branch batching
On CPU `cfg_combine` itself runs that same torch reference (its fused Triton kernel is
CUDA-only), so here only the batching differs. Both sides are checked to reach the
same latent before timing.

Part 2 (single rank vs 3 ranks, one CFG branch per CPU process) needs a served BAGEL
preset between tiny and bagel-7b; until the catalogue has one it is reported as not measured.
"""
from __future__ import annotations

import time

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import LOWER

# Qwen2-style MoT LM, 6 layers of width 512, 256 latent tokens per image (32x32 latent)
BENCH_DIMS = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 64, "max_latent_size": 16}
LATENT_SIDE, QUICK_LATENT_SIDE = 32, 16   # latent (16, side, side): (side/2)^2 tokens
PROMPT_TOKENS, STEPS = 32, 8
MSTAR = "3 CFG branches packed into one bagel_mot_lm forward + cfg_combine component"
BASELINE = "3 sequential bagel_mot_lm forwards (one per branch) + unfused torch combine"
ANCHOR = 1.25  # the M* paper's BAGEL T2I p50 E2E gain over single-stage vLLM-Omni (not the same pair of sides)


class _Branches:
    """One request's three KV sequences (full, text-dropped, image-dropped) over one paged cache."""

    def __init__(self, model, prompt_tokens: int) -> None:
        import torch
        from runtime.bagel.segments import Segment, SegmentKind
        from runtime.kv import KVBlockManager

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
        from runtime.components import component_class
    except ImportError as exc:
        raise Needs(f"BAGEL's components (bagel_mot_lm, cfg_combine): {exc}") from exc
    cat = load_catalogue()
    dims = {**cat["bagel_mot_lm"].presets["tiny"], **BENCH_DIMS}
    torch.manual_seed(0)
    try:
        model = component_class("bagel_mot_lm")(dims, {"seed": 0}).eval()
        combine = component_class("cfg_combine")(cat["cfg_combine"].presets["tiny"], dict(cat["cfg_combine"].args))
    except KeyError as exc:
        raise Needs(f"BAGEL's components: {exc}") from exc
    side = QUICK_LATENT_SIDE if quick else LATENT_SIDE
    latent = torch.randn(dims["latent_channels"], side, side, generator=torch.Generator().manual_seed(2))
    return model, combine, latent, dims


def _times(steps: int) -> list[float]:
    from runtime.bagel.flow import flow_timesteps
    return [float(t) for t in flow_timesteps(steps + 1, shift=3.0)]


def _denoise_batched(branches: _Branches, combine, x, times: list[float]):
    from runtime.components.cfg_combine import CfgRequest
    for t, t_next in zip(times[:-1], times[1:]):
        v_full, v_text, v_img = branches.velocities(x, t, batched=True)
        x, = combine([CfgRequest(x, v_full, v_text, v_img, t, t_next)])
    return x


def _denoise_sequential(branches: _Branches, combine, x, times: list[float]):
    import torch
    from runtime.kernels.cfg import Guidance, cfg_euler_step_reference
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


@register("cfg", "BAGEL T2I: 3 CFG branches in one forward + cfg_combine vs 3 sequential forwards + "
                 "unfused combine; single vs 3-rank placement")
def run(ctx: Context) -> list[Row]:
    ctx.settings.update(dims=BENCH_DIMS, steps=STEPS, prompt_tokens=PROMPT_TOKENS,
                        latent_side=QUICK_LATENT_SIDE if ctx.quick else LATENT_SIDE)
    rows = [_branches_row(ctx)]
    ctx.record_needs("single rank vs 3 ranks (cfg_parallel placement)", Needs(
        "a BAGEL preset between tiny and bagel-7b in the catalogue and graphs/bagel.yaml, so that the "
        "served placements compare compute rather than Python overhead"))
    return rows
