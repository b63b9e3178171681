"""BAGEL image generation through the worker's executors against tools/bench/bagel_upstream.py, a
restatement of BAGEL's own code that shares none of the runtime's (check: `grep -n runtime` on it and on
tools/bench/bagel_upstream_lm.py finds nothing); the `bagel-wide` suite runs it as its peer.

The executors run what a served request runs: the LM engine's paged KV with the CFG branches'
blocks shared, every request's branches and both requests in one LM call per step, branches that
guidance does not use skipped, the cfg node's fused combine and Euler step. The LM's random
weights reach both sides by checkpoint name: a BAGEL-named file given as `--weights llm=FILE`,
and the same dict read by the restatement.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from runtime.model_executor.weights.sources import WeightOptions
from runtime.models.bagel.cfg_combine import CfgCombine, CfgRequest
from runtime.conductor.request import SizedInput
from runtime.transport.messages import WorkItem
from tests.runtime.models.bagel.bagel_harness import Driver, rank_executors, tiny_plan
from tests.runtime.models.bagel.bagel_lm_helpers import bagel_weights
from bench.bagel_upstream import (Bagel, Guidance, effective_scales, guided_velocity, pack,
                                                        unpack)

T2I = {"steps": 5, "timestep_shift": 3.0, "cfg_text_scale": 4.0, "cfg_img_scale": 1.0, "seed": 11,
       "height": 32, "width": 48}                      # BAGEL's text-to-image: no image branch
I2I = {"steps": 5, "timestep_shift": 1.0, "cfg_text_scale": 3.0, "cfg_img_scale": 2.0, "seed": 5,
       "height": 32, "width": 32}                      # t = 1, .75, .5, .25: the last step unguided
PROMPTS = {1: [3, 4, 5], 2: [6, 7]}
# Both sides compute in fp32; latents stay below ~4 in magnitude, where one ulp is 2.4e-7 to 4.8e-7.
# Whole generation: the LM passes differ in summation order (paged SDPA vs the reference's einsum
# attention, fused vs split q/k/v), a few ulps of each O(1) velocity; the text and image combines
# multiply a branch difference by up to text_scale * img_scale (6 here), and four Euler steps add
# dt-weighted velocities that sum to one. Measured max |difference| 9.5e-7 (~4 ulps); 1e-5 leaves
# a 10x margin, while each real difference tried moved the latent by >= 8e-3 (renorm per token
# instead of global 8.3e-3, guidance kept past cfg_interval 5.1e-2, no image branch 9.8e-2,
# cfg_img given the full context 8.5e-2, cfg_text an empty context 0.36).
LATENT_ATOL = 1e-5
# One step: the same formula, only the norms' summation order differs (64 values per token, or the
# whole sample). Measured max 2.4e-7 (one ulp); 2e-6 is ~8 ulps, while renorm per token vs global,
# or renorm_min's clamp, moves the result by >= 1.1e-2.
STEP_ATOL = 2e-6


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    plan = tiny_plan()
    weights = bagel_weights(plan.node("llm").dims, seed=8)
    path = tmp_path_factory.mktemp("bagel-reference") / "llm.safetensors"
    save_file(weights, str(path))
    executors, _ = rank_executors(plan, options=WeightOptions((f"llm={path}",)))
    return plan, executors, weights


def _noise(params: dict) -> torch.Tensor:
    """x at t = 1 as the served API draws it from the request's seed: (16, H/8, W/8) standard normal."""
    g = torch.Generator().manual_seed(params["seed"])
    return torch.randn(16, params["height"] // 8, params["width"] // 8, generator=g)


def _guidance(plan, params: dict) -> Guidance:
    args = plan.node("cfg").args
    return Guidance(params["cfg_text_scale"], params["cfg_img_scale"], tuple(args["cfg_interval"]),
                    args["renorm_type"], args["renorm_min"])


def test_t2i_and_i2i_batched_equal_bagel(served) -> None:
    """A text-to-image and an image-edit request (its VAE latent and ViT rows given) drawn together."""
    plan, executors, weights = served
    g = torch.Generator().manual_seed(0)
    # a 64 x 64 picture's: the VAE's 8 x 8 latent (16 tokens) and the ViT's 4 x 4 patches (what the conductor counts)
    latent, vit_rows = torch.randn(16, 8, 8, generator=g), 0.5 * torch.randn(16, 64, generator=g)
    drv = Driver(plan, executors)
    drv.pictures[2] = SizedInput(torch.zeros(64, 64, 3, dtype=torch.uint8), 16)
    drv.open(1, T2I)
    drv.open(2, I2I)
    drv.group([(n, [WorkItem(2, walk="read_image_vae")], [{"latent": latent}]) for n in ("llm", "llm_cfg_text")])
    drv.group([(n, [WorkItem(2, walk="read_image_vit")], [{"embeds": vit_rows}]) for n in ("llm", "llm_cfg_text")])
    drv.group([(n, [WorkItem(r, tokens=PROMPTS[r], walk="read_text_gen") for r in (1, 2)], [{}, {}])
               for n in ("llm", "llm_cfg_img")])
    drv.draw([1, 2], 5)
    assert drv.value(2, "llm_cfg_img.velocity").numel() == 0     # t = .25 is outside cfg_interval (.4, 1]
    bagel = Bagel(weights, plan.node("llm").dims)
    for rid, params, inputs in ((1, T2I, [PROMPTS[1]]), (2, I2I, [(latent, vit_rows), PROMPTS[2]])):
        contexts = bagel.interleave_inference(inputs)
        want = bagel.generate_image(contexts, _noise(params), params["steps"], params["timestep_shift"],
                                    _guidance(plan, params))
        got = drv.value(rid, "cfg.latent")
        assert got.shape == want.shape == _noise(params).shape
        assert (want - _noise(params)).abs().max() > 0.1          # the steps moved the latent
        torch.testing.assert_close(got, want, rtol=0.0, atol=LATENT_ATOL)


def _request(shape: tuple[int, ...], seed: int, t: float, branches: int, **scales: float) -> CfgRequest:
    """Branch velocities near v_full, as a model's are: the guided norm stays within the clamp for most
    tokens, so "global", "channel" and renorm_min each change the result."""
    g = torch.Generator().manual_seed(seed)
    x, vf, dt, di = (torch.randn(*shape, generator=g) for _ in range(4))
    vt, vi = vf + 0.5 * dt, vf + 0.5 * di
    return CfgRequest(x, vf, vt if branches >= 1 else None, vi if branches >= 2 else None, t, t - 0.125,
                      **{"text_scale": 4.0, "img_scale": 1.5, **scales})


@pytest.mark.parametrize("renorm_type", ["global", "channel", "text_channel"])
def test_one_guided_euler_step_equals_bagel(renorm_type: str) -> None:
    """The cfg node's batch (mixed shapes, branch sets, scales; one step outside the interval)
    against _forward_flow's combine and generate_image's step on BAGEL's packed layout."""
    args = {"renorm_type": renorm_type, "renorm_min": 0.4, "cfg_interval": [0.4, 1.0]}
    node = CfgCombine({"latent_patch_size": 2}, args)
    requests = [_request((16, 4, 6), 0, 0.9, 2), _request((16, 4, 4), 1, 0.7, 2, text_scale=2.5, img_scale=3.0),
                _request((16, 4, 4), 2, 0.6, 1, img_scale=1.0), _request((16, 4, 4), 3, 0.3, 2)]
    for r, got in zip(requests, node(requests)):
        t, t_next = torch.tensor(r.timestep), torch.tensor(r.timestep_next)     # float32, as BAGEL's schedule
        text_scale, img_scale = effective_scales(t, r.text_scale, r.img_scale, tuple(args["cfg_interval"]))
        v = guided_velocity(*(None if u is None else pack(u, 2) for u in (r.v_full, r.v_text, r.v_img)),
                            text_scale, img_scale, renorm_type, args["renorm_min"])
        want = unpack(pack(r.latent, 2) - v * (t - t_next), *r.latent.shape[1:], 2)
        torch.testing.assert_close(got, want, rtol=0.0, atol=STEP_ATOL)
