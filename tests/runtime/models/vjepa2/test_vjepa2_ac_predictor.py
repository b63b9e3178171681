"""vjepa2_ac_predictor: the published formulation, and KV-cached rollout vs the native one.

transformers has no V-JEPA 2-AC predictor. The oracles are (a) the published forward
restated in vjepa2_reference.py (conditioning tokens split out and rotated separately,
transformers' own V-JEPA 2 rotary function, the block-causal mask built densely), and
(b) the native rollout algorithm: re-run the predictor over the whole trajectory at
every step, as V-JEPA 2-AC's planner does.
"""
from __future__ import annotations

import copy

import pytest
import torch

from mstar_compiler.catalogue import load_catalogue
from runtime.models.vjepa2.rollout import cached_rollout, native_rollout, rollout_step, start_rollout
from tests.runtime.models.vjepa2.vjepa2_reference import make, native_ac_forward, randomize, tiny

E, A = 48, 7


@pytest.fixture(scope="module")
def predictor() -> torch.nn.Module:
    return randomize(make("vjepa2_ac_predictor"), seed=3)  # every weight non-trivial


def _inputs(batch: int, context: int, horizon: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    p = (tiny("vjepa2_ac_predictor")["image_size"] // tiny("vjepa2_ac_predictor")["patch_size"]) ** 2
    frames = torch.nn.functional.layer_norm(torch.randn(batch, context * p, E, generator=g), (E,))
    states = torch.cat([torch.randn(batch, context, 6, generator=g) * 0.3,
                        torch.rand(batch, context, 1, generator=g)], dim=-1)
    actions = torch.randn(batch, context + horizon - 1, A, generator=g)  # large: every step must matter
    return frames, states, actions


def test_forward_matches_published_formulation(predictor):
    frames, states, actions = _inputs(2, 3, 1, seed=0)
    with torch.no_grad():
        got = predictor(frames, actions, states)
        want = native_ac_forward(predictor, frames, actions, states)
    assert got.shape == frames.shape
    # the same weights with the conditioning tokens split out and a dense mask: fp32 sums in other orders, a few
    # ulps (eps 1.2e-7) of |x| <= 4.1; measured exact here
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_cached_rollout_equals_native_rollout_h30(predictor):
    """Compared in float64: both rollouts feed their own predictions back for 30 steps, so an
    fp32 rounding difference (other GEMM kernels sum in another order: ~1e-7 relative per step)
    compounds with the horizon and its size depends on the machine's BLAS. In float64 the same
    compounding stays ~1e-13 of values of order 1; 1e-9 leaves four orders of margin while any
    real difference between the two algorithms (a wrong mask, a stale cache row) is >= 1e-3."""
    predictor = copy.deepcopy(predictor).double()
    frames, states, actions = (t.double() for t in _inputs(2, 2, 30, seed=1))
    native = native_rollout(predictor, frames, states, actions, 30)
    cached = torch.stack(cached_rollout(predictor, frames, states, actions))
    assert cached.shape == native.shape == (2, 30, 16, E) and cached.dtype == torch.float64
    assert (native[:, -1] - native[:, -2]).abs().max() > 0.1  # the rollout still moves at the end
    # the docstring's float64 bound (eps 2.2e-16 compounded over 30 steps); measured max 1.9e-14
    torch.testing.assert_close(cached, native, rtol=1e-9, atol=1e-9)


def test_batch_with_different_horizons(predictor):
    frames, states, actions = _inputs(3, 2, 12, seed=2)
    horizons = [3, 12, 7]
    batched = cached_rollout(predictor, frames, states, actions, horizons=horizons)
    for i, h in enumerate(horizons):
        alone = native_rollout(predictor, frames[i:i + 1], states[i:i + 1], actions[i:i + 1, :2 + h - 1], h)
        assert batched[i].shape == (h, 16, E)
        # fp32 rollouts feed their predictions back for up to 12 steps, so a GEMM's order difference (~1e-7 relative)
        # compounds with the horizon (the float64 test above); measured max 3.8e-6 at |x| <= 4.1, 18% of the bound
        torch.testing.assert_close(batched[i], alone[0], rtol=1e-4, atol=1e-5)


def test_requests_joining_mid_rollout_with_other_context_lengths(predictor):
    """Continuous batching: a 1-frame-context request joins a 3-frame one after 4 steps,
    so batches mix a context prefill with a decode step, and decode steps over caches of
    different lengths (padded keys must be masked)."""
    long = _inputs(1, 3, 9, seed=3)
    short = _inputs(1, 1, 6, seed=4)
    r_long = start_rollout(predictor, long[0][0], long[1][0], long[2][0], 9)
    r_short = start_rollout(predictor, short[0][0], short[1][0], short[2][0], 6)
    for _ in range(4):
        rollout_step(predictor, [r_long])
    while active := [r for r in (r_long, r_short) if not r.is_done]:
        rollout_step(predictor, active)
    for r, (frames, states, actions), h in ((r_long, long, 9), (r_short, short, 6)):
        want = native_rollout(predictor, frames, states, actions, h)[0]
        # as above, over up to 9 fed-back fp32 steps: measured max 4.9e-6 at |x| <= 4.7, 28% of the bound
        torch.testing.assert_close(torch.stack(r.predictions), want, rtol=1e-4, atol=1e-5)


def test_cache_size_is_what_the_catalogue_plans(predictor):
    spec = load_catalogue()["vjepa2_ac_predictor"]
    cache = predictor.new_cache(max_steps=5)
    per_token = spec.kv_bytes_per_token(spec.presets["tiny"], 4)
    assert cache.nbytes() == per_token * 5 * predictor.tokens_per_step
    frames, states, actions = _inputs(1, 2, 5, seed=5)
    with pytest.raises(ValueError, match="full"):
        predictor(torch.cat([frames] * 3, 1), torch.cat([actions[:, :2]] * 3, 1), torch.cat([states] * 3, 1),
                  caches=[cache])
