"""rollout: V-JEPA 2-AC world-model rollout, mstar's per-frame KV cache vs the native rollout.

A side is one whole rollout of horizon H from one context frame, batch 1, in this process
on the same random weights: mstar advances it with `runtime.models.vjepa2.rollout.rollout_step`
(what each iteration of the `rollout` walk's DynamicLoop runs: only the new frame's
tokens, attending to the cached ones); the baseline is V-JEPA 2-AC's own algorithm,
re-running the predictor over the whole trajectory at every step. Both are checked to
predict the same frames before timing.
"""
from __future__ import annotations

import time

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import LOWER

HORIZONS = (4, 15, 30)
ANCHORS = {4: 2.08, 15: 3.76, 30: 12.5}  # the M* paper's rollout speed-ups at these horizons
# (preset, image size): tiny is overhead-bound; ac-mid (8 layers, width 512) at 128 px
# (64 patch tokens per frame) keeps H = 30 of the native rollout within a minute here.
CASES = (("tiny", None), ("ac-mid", 128))
QUICK_CASES = (("tiny", None), ("ac-mid", 64))
MSTAR = "DynamicLoop step (runtime.models.vjepa2.rollout.rollout_step) + per-frame KV cache"
NATIVE = "native V-JEPA 2-AC rollout: predictor re-run over the whole trajectory each step"


def _build(preset: str, image_size: int | None):
    try:
        import torch
        from mstar_compiler.catalogue import load_catalogue
        from runtime.model_executor.components import component_class
        from runtime.models.vjepa2.rollout import cached_rollout, native_rollout
    except ImportError as exc:
        raise Needs(f"the V-JEPA 2-AC predictor (runtime/models/vjepa2/rollout.py): {exc}") from exc
    spec = load_catalogue()["vjepa2_ac_predictor"]
    dims = {**spec.presets[preset], **({"image_size": image_size} if image_size else {})}
    torch.manual_seed(0)
    model = component_class("vjepa2_ac_predictor")(dims, dict(spec.args)).eval()
    return model, dims, cached_rollout, native_rollout


def _inputs(model, dims: dict, horizon: int):
    import torch
    g = torch.Generator().manual_seed(horizon)
    frames = torch.randn(1, model.tokens_per_frame, dims["embed_dim"], generator=g)  # (B, C*P, E), C = 1
    states = torch.rand(1, 1, dims["state_dim"], generator=g)                       # (B, C, S)
    actions = 0.05 * torch.randn(1, horizon, dims["action_dim"], generator=g)       # (B, C+H-1, A)
    return frames, states, actions


def _timed(fn) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"time": time.perf_counter() - start}


def _case(ctx: Context, preset: str, image_size: int | None, horizon: int) -> Row:
    model, dims, cached, native = _build(preset, image_size)
    frames, states, actions = _inputs(model, dims, horizon)
    diff = (cached(model, frames, states, actions)[0] - native(model, frames, states, actions, horizon)[0]
            ).abs().max().item()
    if diff > 1e-3:
        raise AssertionError(f"{preset} H={horizon}: cached and native rollouts differ by {diff:.2e}")
    name = preset if image_size is None else f"{preset}-{image_size}px"
    samples = ctx.alternate(f"rollout {name} H={horizon}", {
        "mstar": lambda: _timed(lambda: cached(model, frames, states, actions)),
        "native": lambda: _timed(lambda: native(model, frames, states, actions, horizon)),
    }, warmup=0)  # the agreement check above already ran both sides once
    return Row(f"{name} H={horizon}", "rollout time", "s", LOWER, Side(MSTAR, samples["mstar"]["time"]),
               Side(NATIVE, samples["native"]["time"]), ANCHORS[horizon], plot=f"time-vs-horizon-{name}",
               x=horizon, xlabel="horizon H (frames)", note=f"{model.tokens_per_frame} patch tokens/frame; max |diff| {diff:.1e}")


@register("rollout", "V-JEPA 2-AC rollout: mstar DynamicLoop + per-frame KV cache vs the native "
                     "re-run-everything rollout")
def run(ctx: Context) -> list[Row]:
    cases = QUICK_CASES if ctx.quick else CASES
    ctx.settings.update(cases=[list(c) for c in cases], horizons=list(HORIZONS), batch=1, context_frames=1)
    return [_case(ctx, preset, size, h) for preset, size in cases for h in HORIZONS]
