"""The BAGEL image-generation walk wired from the components, as runtime/models/bagel/__init__.py
describes it, against BAGEL's `generate_image` loop on the dense reference.

Two I2I requests run together: per step one `bagel_mot_lm` call holds the three CFG
branches of both (six GEN segments), then one `cfg_combine` call; the text-dropped
branch shares the image prefix's KV blocks with the full branch (a fork).
"""
from __future__ import annotations

import torch

from tests.runtime.models.bagel.bagel_lm_helpers import DIMS, RefSequence, Runner, bagel_weights, build_lm
from bench.bagel_upstream_lm import DenseBagel
from mstar_compiler.catalogue import load_catalogue
from runtime.models.bagel.flow import flow_timesteps
from runtime.model_executor.images import png_bytes
from runtime.models.bagel.segments import SegmentKind as K
from runtime.model_executor.components import component_class
from runtime.models.bagel.cfg_combine import CfgRequest
from runtime.models.bagel.cfg_kernel import Guidance, cfg_euler_step

STEPS, SHIFT, INTERVAL, TEXT_SCALE, IMG_SCALE = 4, 3.0, (0.7, 1.0), 4.0, 1.5
BRANCHES = ("full", "cfg_text", "cfg_img")


def _prefill(runner: Runner, req: str, prompt: list[int], vit: torch.Tensor, image_latent: torch.Tensor) -> None:
    """BAGEL's contexts: full = image + text; cfg_text = image (a fork); cfg_img = text."""
    runner.one(f"{req}/full", K.VAE, latent=image_latent)
    runner.one(f"{req}/full", K.VIT, embeds=vit)
    runner.blocks.fork(f"{req}/full", f"{req}/cfg_text")
    runner.rope[f"{req}/cfg_text"] = runner.rope[f"{req}/full"]
    runner.run([(f"{req}/full", runner.segment(f"{req}/full", K.TEXT, tokens=torch.tensor(prompt))),
                (f"{req}/cfg_img", runner.segment(f"{req}/cfg_img", K.TEXT, tokens=torch.tensor(prompt)))])


def _draw(runner: Runner, cfg, requests: list[str], noise: dict) -> dict:
    t = flow_timesteps(STEPS, SHIFT)
    x = dict(noise)
    for i in range(STEPS - 1):
        calls = [(f"{r}/{b}", runner.segment(f"{r}/{b}", K.GEN, latent=x[r], timestep=float(t[i])))
                 for r in requests for b in BRANCHES]
        v = runner.run(calls)
        x = dict(zip(requests, cfg([CfgRequest(x[r], *v[3 * j:3 * j + 3], float(t[i]), float(t[i + 1]),
                                               TEXT_SCALE, IMG_SCALE)
                                    for j, r in enumerate(requests)])))
    return x


def _bagel_generate_image(ref: DenseBagel, prompt, vit, image_latent, noise):
    """BAGEL's interleave_inference + generate_image for [image, prompt], dense."""
    full, cfg_text, cfg_img = RefSequence(ref), RefSequence(ref), RefSequence(ref)
    full.vae(image_latent)
    full.vit(vit)
    cfg_text.context, cfg_text.rope = full.context, full.rope
    full.text(prompt)
    cfg_img.text(prompt)
    timesteps = torch.linspace(1, 0, STEPS)
    timesteps = SHIFT * timesteps / (1 + (SHIFT - 1) * timesteps)
    dts = timesteps[:-1] - timesteps[1:]
    x = noise
    for i, t in enumerate(timesteps[:-1]):
        v = [seq.gen(x, float(t)) for seq in (full, cfg_text, cfg_img)]
        g = Guidance.uniform(1, TEXT_SCALE, IMG_SCALE, INTERVAL)
        x = cfg_euler_step(x[None], *(u[None] for u in v), t[None], (t - dts[i])[None], g, backend="torch")[0]
    return x


def test_i2i_walk_matches_bagel():
    torch.manual_seed(0)
    weights = bagel_weights(DIMS, seed=5)
    runner = Runner(build_lm(weights), num_blocks=96, block_size=4)
    cat = load_catalogue()
    cfg = component_class("cfg_combine")(cat["cfg_combine"].presets["tiny"],
                                         {**cat["cfg_combine"].args, "text_scale": TEXT_SCALE,
                                          "img_scale": IMG_SCALE, "cfg_interval": INTERVAL})
    inputs = {r: ([3 + j, 40, 41 + j], torch.randn(4, 64) * 0.5, torch.randn(16, 4, 4), torch.randn(16, 4, 4))
              for j, r in enumerate(["a", "b"])}
    for r, (prompt, vit, image_latent, _) in inputs.items():
        _prefill(runner, r, prompt, vit, image_latent)
    shared = runner.blocks.table("a/cfg_text").blocks[:-1]
    assert shared == runner.blocks.table("a/full").blocks[:len(shared)]  # the image prefix is not copied
    got = _draw(runner, cfg, ["a", "b"], {r: v[3] for r, v in inputs.items()})
    ref = DenseBagel(weights, DIMS)
    for r, (prompt, vit, image_latent, noise) in inputs.items():
        want = _bagel_generate_image(ref, prompt, vit, image_latent, noise)
        # the paged, batched generation against the dense one, fp32, over every Euler step: order differences
        # carried through the steps; measured max 6e-7 at |x| <= 3.4, 2.4% of the bound
        torch.testing.assert_close(got[r], want, rtol=1e-4, atol=1e-5)
        assert (got[r] - noise).abs().max() > 1e-3
    dec = component_class("vae_decoder")(cat["vae_decoder"].presets["tiny"], cat["vae_decoder"].args)
    image = dec([got["a"]])[0]
    assert image.shape == (3, 32, 32) and png_bytes(image).startswith(b"\x89PNG")
