"""The fused CFG kernel equals its torch reference, and the reference equals BAGEL's formula.

The Triton kernel runs under TRITON_INTERPRET=1 on CPU (tests/conftest.py switches it on)
and compiled on a CUDA device when there is one. BAGEL's formula is written out below
the way `Bagel._forward_flow` states it: on packed latent tokens (T, p*p*C) of one sample.
"""
from __future__ import annotations

import pytest
import torch

from runtime.models.bagel.cfg_kernel import RENORM_TYPES, Guidance, cfg_euler_step, cfg_euler_step_triton

P = 2
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _batch(b: int, c: int, h: int, w: int, dtype: torch.dtype, seed: int = 0):
    """latent, v_full, v_text, v_img on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, c, h, w, generator=g).to(DEVICE, dtype) for _ in range(4))


def _mixed_guidance(b: int) -> tuple[Guidance, torch.Tensor, torch.Tensor]:
    """Samples inside the interval, outside it, without image CFG, without any CFG."""
    t = torch.tensor([0.9, 0.3, 0.7, 0.55][:b])
    t_next = t - torch.tensor([0.05, 0.1, 0.02, 0.05][:b])
    g = Guidance(text_scale=torch.tensor([4.0, 4.0, 3.0, 1.0][:b]),
                 img_scale=torch.tensor([1.5, 2.0, 1.0, 2.0][:b]),
                 interval_lo=torch.full((b,), 0.4), interval_hi=torch.full((b,), 1.0))
    return _on_device(g), t.to(DEVICE), t_next.to(DEVICE)


def _on_device(g: Guidance) -> Guidance:
    return Guidance(*(x.to(DEVICE) for x in (g.text_scale, g.img_scale, g.interval_lo, g.interval_hi)))


@pytest.mark.parametrize("renorm_type", RENORM_TYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_matches_reference(renorm_type, dtype):
    x, vf, vt, vi = _batch(4, 16, 4, 6, dtype)
    x = x.float()  # the loop-carried latent is fp32, velocities in the model dtype
    g, t, t_next = _mixed_guidance(4)
    kw = dict(renorm_type=renorm_type, renorm_min=0.25, patch_size=P)
    got = cfg_euler_step_triton(x, vf, vt, vi, t, t_next, g, **kw)
    want = cfg_euler_step(x, vf, vt, vi, t, t_next, g, backend="torch", **kw)
    assert got.dtype == x.dtype
    # both sides compute in fp32 from the same (exactly widened) velocities; the renorms' sums run in another order:
    # a few ulps (eps 1.2e-7) at |x| <= 4.1; measured max 1.2e-7, 0.6% of the bound
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, x)


@pytest.mark.parametrize("renorm_type", RENORM_TYPES)
def test_kernel_matches_reference_over_many_blocks(renorm_type):
    """36 tokens per sample: several BLOCK_T tiles (and splits for per-token modes)."""
    x, vf, vt, vi = _batch(2, 16, 12, 12, torch.float32, seed=1)
    g = Guidance.uniform(2, 4.0, 1.5, (0.0, 1.0), DEVICE)
    t, t_next = torch.tensor([0.8, 0.5], device=DEVICE), torch.tensor([0.75, 0.45], device=DEVICE)
    got = cfg_euler_step_triton(x, vf, vt, vi, t, t_next, g, renorm_type=renorm_type)
    want = cfg_euler_step(x, vf, vt, vi, t, t_next, g, renorm_type=renorm_type, backend="torch")
    # as above, the renorms summing over several tiles: measured max 2.4e-7, 0.8% of the bound
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("branches", ["text_only", "none"])
def test_kernel_without_branches(branches):
    x, vf, vt, _ = _batch(2, 16, 4, 4, torch.bfloat16)
    vt = vt if branches == "text_only" else None
    g = Guidance.uniform(2, 4.0, 2.0, (0.0, 1.0), DEVICE)
    t, t_next = torch.tensor([0.8, 0.6], device=DEVICE), torch.tensor([0.7, 0.5], device=DEVICE)
    got = cfg_euler_step_triton(x, vf, vt, None, t, t_next, g)
    want = cfg_euler_step(x, vf, vt, None, t, t_next, g, backend="torch")
    # x is bf16 here, so the step's result is rounded to bf16 (steps of 2^-7 relative: 3.1e-2 at |x| in [4, 8)); the
    # kernel rounds once from fp32, torch's bf16 ops at other points, so they may land a step apart: measured max
    # 3.1e-2 at |x| = 4.1, 62% of the bound (about 1.3 steps)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)


# ----------------------------------------------------------- BAGEL's formula, verbatim shape

def _pack(v: torch.Tensor) -> torch.Tensor:
    """(C, h, w) -> BAGEL's packed tokens (T, p*p*C), einsum "chpwq->hwpqc"."""
    c, h, w = v.shape
    v = v.reshape(c, h // P, P, w // P, P)
    return torch.einsum("chpwq->hwpqc", v).reshape(-1, P * P * c)


def _bagel_velocity(v_t, cfg_text_v_t, cfg_img_v_t, cfg_text_scale, cfg_img_scale,
                    cfg_renorm_type, cfg_renorm_min):
    """`Bagel._forward_flow`'s guidance, written as BAGEL writes it."""
    if cfg_text_scale > 1.0:
        if cfg_renorm_type == "text_channel":
            v_t_text_ = cfg_text_v_t + cfg_text_scale * (v_t - cfg_text_v_t)
            norm_v_t = torch.norm(v_t, dim=-1, keepdim=True)
            norm_v_t_text_ = torch.norm(v_t_text_, dim=-1, keepdim=True)
            scale = (norm_v_t / (norm_v_t_text_ + 1e-8)).clamp(min=cfg_renorm_min, max=1.0)
            v_t_text = v_t_text_ * scale
            if cfg_img_scale > 1.0:
                v_t = cfg_img_v_t + cfg_img_scale * (v_t_text - cfg_img_v_t)
            else:
                v_t = v_t_text
        else:
            v_t_text_ = cfg_text_v_t + cfg_text_scale * (v_t - cfg_text_v_t)
            if cfg_img_scale > 1.0:
                v_t_ = cfg_img_v_t + cfg_img_scale * (v_t_text_ - cfg_img_v_t)
            else:
                v_t_ = v_t_text_
            if cfg_renorm_type == "global":
                norm_v_t = torch.norm(v_t)
                norm_v_t_ = torch.norm(v_t_)
            else:
                norm_v_t = torch.norm(v_t, dim=-1, keepdim=True)
                norm_v_t_ = torch.norm(v_t_, dim=-1, keepdim=True)
            scale = (norm_v_t / (norm_v_t_ + 1e-8)).clamp(min=cfg_renorm_min, max=1.0)
            v_t = v_t_ * scale
    return v_t


def _bagel_step(x, vf, vt, vi, t, t_next, text_scale, img_scale, interval, renorm_type, renorm_min):
    if t > interval[0] and t <= interval[1]:
        ts, is_ = text_scale, img_scale
    else:
        ts, is_ = 1.0, 1.0
    v = _bagel_velocity(_pack(vf), _pack(vt), _pack(vi), ts, is_, renorm_type, renorm_min)
    return _pack(x) - v * (t - t_next)


@pytest.mark.parametrize("renorm_type", RENORM_TYPES)
@pytest.mark.parametrize("t", [0.9, 0.2], ids=["inside_interval", "outside_interval"])
@pytest.mark.parametrize("scales", [(4.0, 1.5), (3.0, 1.0), (1.0, 2.0)], ids=["text_img", "text", "off"])
def test_reference_matches_bagel_formula(renorm_type, t, scales):
    x, vf, vt, vi = (v.cpu() for v in _batch(1, 16, 6, 4, torch.float32, seed=2))
    t_next, interval, renorm_min = t - 0.04, (0.4, 1.0), 0.1
    g = Guidance.uniform(1, scales[0], scales[1], interval)
    got = cfg_euler_step(x, vf, vt, vi, torch.tensor([t]), torch.tensor([t_next]), g,
                         renorm_type=renorm_type, renorm_min=renorm_min, backend="torch")
    want = _bagel_step(x[0], vf[0], vt[0], vi[0], t, t_next, *scales, interval, renorm_type, renorm_min)
    # BAGEL's formula on packed tokens against ours on (C, h, w): the norms sum the same values in another order,
    # fp32, a few ulps (eps 1.2e-7) at |x| <= 3.4; measured max 2.4e-7, 16% of the bound
    torch.testing.assert_close(_pack(got[0]), want, rtol=1e-6, atol=1e-6)


def test_guidance_changes_the_step():
    """Inside the interval guidance moves the step away from plain v_full Euler."""
    x, vf, vt, vi = (v.cpu() for v in _batch(1, 16, 4, 4, torch.float32, seed=3))
    t, t_next = torch.tensor([0.9]), torch.tensor([0.8])
    guided = cfg_euler_step(x, vf, vt, vi, t, t_next, Guidance.uniform(1, 4.0, 1.5, (0.4, 1.0)))
    plain = x - vf * 0.1
    assert (guided - plain).abs().max() > 1e-3
    off = cfg_euler_step(x, vf, vt, vi, t, t_next, Guidance.uniform(1, 4.0, 1.5, (0.0, 0.5)))
    # t - t_next is 0.9 - 0.8 in fp32 (0.100000024), the test's 0.1 a float64: an ulp's rounding of each step;
    # measured max 2.4e-7, inside torch's fp32 defaults (rtol 1.3e-6, atol 1e-5)
    torch.testing.assert_close(off, plain)


def test_rejects_unknown_renorm_type():
    x, vf, vt, vi = (v.cpu() for v in _batch(1, 16, 4, 4, torch.float32))
    with pytest.raises(ValueError, match="renorm_type"):
        cfg_euler_step(x, vf, vt, vi, torch.tensor([0.5]), torch.tensor([0.4]),
                       Guidance.uniform(1, 4.0, 1.5, (0.0, 1.0)), renorm_type="spatial")


@pytest.mark.gpu
@pytest.mark.parametrize("renorm_type", RENORM_TYPES)
def test_compiled_kernel_on_a_1024px_latent(renorm_type):
    """A 1024 x 1024 image's latent (16 x 128 x 128, 4096 tokens) in bf16, compiled."""
    x, vf, vt, vi = _batch(3, 16, 128, 128, torch.bfloat16, seed=4)
    g, t, t_next = _mixed_guidance(3)
    x = x.float()
    got = cfg_euler_step(x, vf, vt, vi, t, t_next, g, renorm_type=renorm_type)  # auto: triton on CUDA
    want = cfg_euler_step(x, vf, vt, vi, t, t_next, g, renorm_type=renorm_type, backend="torch")
    # fp32 math on both sides over bf16 velocities widened exactly; the compiled kernel's norms sum 4096 tokens in
    # tiles, torch's in its own order: 1e-4 is ~800 fp32 eps (1.2e-7); not measured here (no GPU)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
