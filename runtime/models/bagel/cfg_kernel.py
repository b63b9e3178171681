"""Fused BAGEL classifier-free guidance: combine + renorm + Euler step in one kernel.

Owns `cfg_euler_step` (the entry point `cfg_combine` calls), its torch reference
`cfg_euler_step_reference`, and the Triton kernel. BAGEL's formula
(`Bagel._forward_flow` + the Euler update in `Bagel.generate_image`), per sample, with
v = v_full (full condition), v_t = v_text (text dropped), v_i = v_img (image dropped):

  outside cfg_interval (lo < t <= hi fails): text_scale = img_scale = 1
  text_scale <= 1:  v = v_full                                        (no guidance at all)
  "global"/"channel":
      v_ = v_t + text_scale * (v_full - v_t)
      v_ = v_i + img_scale * (v_ - v_i)                if img_scale > 1
      v  = v_ * clamp(|v_full| / (|v_| + 1e-8), renorm_min, 1)
  "text_channel":
      v_ = v_t + text_scale * (v_full - v_t)
      v_ = v_ * clamp(|v_full| / (|v_| + 1e-8), renorm_min, 1)
      v  = v_i + img_scale * (v_ - v_i)                if img_scale > 1 else v_
  x_next = x - v * (t - t_next)

|.| is the L2 norm over the whole sample ("global") or per latent token ("channel",
"text_channel"): BAGEL's token is a p x p patch of all C latent channels (2 x 2 x 16 = 64
values), so on a (C, h, w) latent the per-token norm runs over each p x p spatial patch
and every channel. Compute is fp32 whatever the input dtypes; the result has the
latent's dtype. Every sample of a batch has its own t, t_next, scales and interval
(continuous batching mixes requests at different steps).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

RENORM_TYPES = ("global", "channel", "text_channel")
_EPS = 1e-8


@dataclass(frozen=True)
class Guidance:
    """Per-sample guidance settings of one batch; every tensor is float32 of shape (B,)."""

    text_scale: torch.Tensor    # cfg_text_scale
    img_scale: torch.Tensor     # cfg_img_scale
    interval_lo: torch.Tensor   # guidance active where interval_lo < t <= interval_hi
    interval_hi: torch.Tensor

    @classmethod
    def uniform(cls, batch: int, text_scale: float, img_scale: float,
                interval: tuple[float, float], device: torch.device | str = "cpu") -> Guidance:
        def full(value: float) -> torch.Tensor:
            return torch.full((batch,), float(value), dtype=torch.float32, device=device)

        return cls(full(text_scale), full(img_scale), full(interval[0]), full(interval[1]))


def _effective_scales(t: torch.Tensor, g: Guidance) -> tuple[torch.Tensor, torch.Tensor]:
    active = (t > g.interval_lo) & (t <= g.interval_hi)
    one = torch.ones_like(g.text_scale)
    return torch.where(active, g.text_scale, one), torch.where(active, g.img_scale, one)


def _token_norm(v: torch.Tensor, p: int) -> torch.Tensor:
    """L2 norm over each p x p patch of all channels, broadcast back to (C, h, w)."""
    c, h, w = v.shape
    patches = v.reshape(c, h // p, p, w // p, p)  # (C, h/p, p, w/p, p)
    norm = patches.square().sum(dim=(0, 2, 4), keepdim=True).sqrt()
    return norm.expand_as(patches).reshape(c, h, w)


def _renorm(v_ref: torch.Tensor, v_: torch.Tensor, per_token: bool, p: int, lo: float) -> torch.Tensor:
    norm_ref = _token_norm(v_ref, p) if per_token else v_ref.norm()
    norm_ = _token_norm(v_, p) if per_token else v_.norm()
    return v_ * (norm_ref / (norm_ + _EPS)).clamp(min=lo, max=1.0)


def _guided_velocity(vf, vt, vi, ts: float, is_: float, renorm_type: str, lo: float, p: int):
    if vt is None or ts <= 1.0:
        return vf
    use_img = vi is not None and is_ > 1.0
    v_ = vt + ts * (vf - vt)
    if renorm_type == "text_channel":
        v_ = _renorm(vf, v_, True, p, lo)
        return vi + is_ * (v_ - vi) if use_img else v_
    if use_img:
        v_ = vi + is_ * (v_ - vi)
    return _renorm(vf, v_, renorm_type == "channel", p, lo)


def cfg_euler_step_reference(latent: torch.Tensor, v_full: torch.Tensor, v_text: torch.Tensor | None,
                             v_img: torch.Tensor | None, t: torch.Tensor, t_next: torch.Tensor,
                             guidance: Guidance, *, renorm_type: str = "global",
                             renorm_min: float = 0.0, patch_size: int = 2) -> torch.Tensor:
    """Torch reference of `cfg_euler_step`, one sample at a time, in fp32."""
    ts, is_ = _effective_scales(t.float(), guidance)
    out = torch.empty_like(latent)
    for b in range(latent.shape[0]):
        vt = None if v_text is None else v_text[b].float()
        vi = None if v_img is None else v_img[b].float()
        v = _guided_velocity(v_full[b].float(), vt, vi, float(ts[b]), float(is_[b]),
                             renorm_type, renorm_min, patch_size)
        out[b] = (latent[b].float() - v * (t[b].float() - t_next[b].float())).to(latent.dtype)
    return out


@triton.jit
def _tile(start, base, wt, num_tokens, W, d_off, d_mask, P: tl.constexpr, BLOCK_T: tl.constexpr):
    """Offsets (BLOCK_T, BLOCK_D) of tokens start.. of one sample, and their mask."""
    tok = start + tl.arange(0, BLOCK_T)
    offs = base + ((tok // wt) * P * W + (tok % wt) * P)[:, None] + d_off[None, :]
    return offs, (tok < num_tokens)[:, None] & d_mask[None, :]


@triton.jit
def _load(ptr, offs, mask):
    return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _image_combine(v_, vi_ptr, offs, mask, i_s, use_img):
    vi = _load(vi_ptr, offs, mask)
    return tl.where(use_img, vi + i_s * (v_ - vi), v_)


@triton.jit
def _token_renorm(v_ref, v_, renorm_min):
    scale = tl.sqrt(tl.sum(v_ref * v_ref, axis=1)) / (tl.sqrt(tl.sum(v_ * v_, axis=1)) + 1e-8)
    return v_ * tl.minimum(tl.maximum(scale, renorm_min), 1.0)[:, None]


@triton.jit
def _cfg_kernel(
    x_ptr, vf_ptr, vt_ptr, vi_ptr, out_ptr,
    t_ptr, tn_ptr, ts_ptr, is_ptr, lo_ptr, hi_ptr,
    renorm_min, C, H, W,
    P: tl.constexpr, MODE: tl.constexpr, HAS_TEXT: tl.constexpr, HAS_IMG: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # program (b, split): sample b, token blocks split, split + nsplit, ... ("global": nsplit == 1)
    b = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.load(t_ptr + b)
    dt = t - tl.load(tn_ptr + b)
    active = (t > tl.load(lo_ptr + b)) & (t <= tl.load(hi_ptr + b))
    ts = tl.where(active, tl.load(ts_ptr + b), 1.0)
    i_s = tl.where(active, tl.load(is_ptr + b), 1.0)
    use_img = i_s > 1.0

    wt = W // P
    num_tokens = (H // P) * wt
    d = tl.arange(0, BLOCK_D)
    # element d of a token is channel d % C at patch offset (d // C // P, d // C % P)
    d_off = (d % C) * H * W + (d // C // P) * W + (d // C) % P
    d_mask = d < C * P * P
    base = b.to(tl.int64) * C * H * W

    global_scale = 1.0
    if MODE == 0:  # "global": a first pass over the sample for the two norms
        acc_full = tl.zeros([BLOCK_T], dtype=tl.float32)
        acc_guided = tl.zeros([BLOCK_T], dtype=tl.float32)
        for start in range(0, num_tokens, BLOCK_T):
            offs, mask = _tile(start, base, wt, num_tokens, W, d_off, d_mask, P, BLOCK_T)
            vf = _load(vf_ptr, offs, mask)
            v_ = vf
            if HAS_TEXT:
                vt = _load(vt_ptr, offs, mask)
                v_ = vt + ts * (vf - vt)
                if HAS_IMG:
                    v_ = _image_combine(v_, vi_ptr, offs, mask, i_s, use_img)
            acc_full += tl.sum(vf * vf, axis=1)
            acc_guided += tl.sum(v_ * v_, axis=1)
        global_scale = tl.sqrt(tl.sum(acc_full, axis=0)) / (tl.sqrt(tl.sum(acc_guided, axis=0)) + 1e-8)
        global_scale = tl.minimum(tl.maximum(global_scale, renorm_min), 1.0)

    for start in range(split * BLOCK_T, num_tokens, tl.num_programs(1) * BLOCK_T):
        offs, mask = _tile(start, base, wt, num_tokens, W, d_off, d_mask, P, BLOCK_T)
        vf = _load(vf_ptr, offs, mask)
        v = vf
        if HAS_TEXT:
            vt = _load(vt_ptr, offs, mask)
            v_ = vt + ts * (vf - vt)
            if MODE == 2:  # "text_channel": renorm the text combine, then the image combine
                v_ = _token_renorm(vf, v_, renorm_min)
                if HAS_IMG:
                    v_ = _image_combine(v_, vi_ptr, offs, mask, i_s, use_img)
            else:
                if HAS_IMG:
                    v_ = _image_combine(v_, vi_ptr, offs, mask, i_s, use_img)
                if MODE == 1:  # "channel": per-token renorm
                    v_ = _token_renorm(vf, v_, renorm_min)
                else:
                    v_ = v_ * global_scale
            v = tl.where(ts > 1.0, v_, vf)
        x = _load(x_ptr, offs, mask)
        tl.store(out_ptr + offs, (x - v * dt).to(out_ptr.dtype.element_ty), mask=mask)


def cfg_euler_step_triton(latent: torch.Tensor, v_full: torch.Tensor, v_text: torch.Tensor | None,
                          v_img: torch.Tensor | None, t: torch.Tensor, t_next: torch.Tensor,
                          guidance: Guidance, *, renorm_type: str = "global",
                          renorm_min: float = 0.0, patch_size: int = 2) -> torch.Tensor:
    """The fused kernel behind `cfg_euler_step` (CUDA tensors, or CPU under TRITON_INTERPRET=1)."""
    b, c, h, w = latent.shape
    out = torch.empty_like(latent)
    num_tokens = (h // patch_size) * (w // patch_size)
    block_t = 16
    mode = RENORM_TYPES.index(renorm_type)
    nsplit = 1 if mode == 0 else max(1, min(triton.cdiv(num_tokens, block_t), 64))
    tensors = [x.contiguous() if x is not None else None for x in (latent, v_full, v_text, v_img)]
    x, vf, vt, vi = tensors
    scalars = [s.to(device=latent.device, dtype=torch.float32).contiguous() for s in (
        t, t_next, guidance.text_scale, guidance.img_scale, guidance.interval_lo, guidance.interval_hi)]
    _cfg_kernel[(b, nsplit)](
        x, vf, vf if vt is None else vt, vf if vi is None else vi, out, *scalars,
        float(renorm_min), c, h, w,
        P=patch_size, MODE=mode, HAS_TEXT=vt is not None, HAS_IMG=vi is not None,
        BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(c * patch_size * patch_size),
    )
    return out


def cfg_euler_step(latent: torch.Tensor, v_full: torch.Tensor, v_text: torch.Tensor | None,
                   v_img: torch.Tensor | None, t: torch.Tensor, t_next: torch.Tensor,
                   guidance: Guidance, *, renorm_type: str = "global", renorm_min: float = 0.0,
                   patch_size: int = 2, backend: str = "auto") -> torch.Tensor:
    """One guided Euler step for a batch of same-shaped latents.

    latent, v_full, v_text, v_img: (B, C, h, w), any float dtype (v_text / v_img None when
    that branch is not run); t, t_next: (B,) timesteps of this step and the next;
    backend: "triton" (the fused kernel), "torch" (the reference) or "auto" (triton on
    CUDA tensors, torch otherwise). Returns x_next: (B, C, h, w) in latent's dtype.
    """
    if renorm_type not in RENORM_TYPES:
        raise ValueError(f"cfg renorm_type {renorm_type!r} is not one of {RENORM_TYPES}")
    if latent.shape[-1] % patch_size or latent.shape[-2] % patch_size:
        raise ValueError(f"latent {tuple(latent.shape)} is not a multiple of patch {patch_size}")
    use_triton = backend == "triton" or (backend == "auto" and latent.is_cuda)
    step = cfg_euler_step_triton if use_triton else cfg_euler_step_reference
    return step(latent, v_full, v_text, v_img, t, t_next, guidance,
                renorm_type=renorm_type, renorm_min=renorm_min, patch_size=patch_size)
