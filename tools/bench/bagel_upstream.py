"""BAGEL's image generation restated in plain torch: the oracle of the BAGEL tests'
test_bagel_reference_generation.py and the `bagel-wide` suite's peer (bench.bagel_peer).

Imports torch and this folder's bagel_upstream_lm.py (DenseBagel: BAGEL's mixture-of-transformers LM,
dense and unbatched, tensors looked up by checkpoint name), nothing of mstar's. Restated from
ByteDance-Seed/Bagel:
  inferencer.py `interleave_inference`: three contexts built input by input (text: cfg_text <- a
      copy of full, then the text into full and into cfg_img; image: its VAE block then its ViT
      block into full, then cfg_text <- a copy of full)
  bagel.py `gen_text`: greedy text from [bos], one causal row per step, each extending the context
  bagel.py `generate_image`: the shifted schedule and the Euler steps, guidance only inside
      cfg_interval, a CFG branch run only when its scale is > 1
  bagel.py `_forward_flow`: one pass per branch over [soi] + noisy latent rows + [eoi] at one RoPE
      position that reads the branch's context without extending it, then the text and image
      combines with BAGEL's renorm ("global", "channel", "text_channel")
The latent stays in BAGEL's packed layout between steps (one row per p x p patch of every channel,
`pack`), as generate_image keeps it, so "channel" renorm is BAGEL's norm over a row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.bagel_upstream_lm import DenseBagel

NO_ROWS = torch.tensor([], dtype=torch.long)


def pack(latent: torch.Tensor, p: int) -> torch.Tensor:
    """(C, H, W) -> (H/p * W/p, p*p*C), prepare_vae_images' einsum."""
    c, h, w = latent.shape
    return torch.einsum("chpwq->hwpqc", latent.reshape(c, h // p, p, w // p, p)).reshape(-1, p * p * c)


def unpack(tokens: torch.Tensor, h: int, w: int, p: int) -> torch.Tensor:
    """(h/p * w/p, p*p*C) -> (C, h, w), decode_image's einsum."""
    c = tokens.shape[-1] // (p * p)
    return torch.einsum("hwpqc->chpwq", tokens.reshape(h // p, w // p, p, p, c)).reshape(c, h, w)


def effective_scales(t: torch.Tensor, text_scale: float, img_scale: float, interval: tuple[float, float]
                     ) -> tuple[float, float]:
    """generate_image: the scales of a step at time t (1, 1 outside cfg_interval)."""
    return (text_scale, img_scale) if interval[0] < t <= interval[1] else (1.0, 1.0)


def guided_velocity(v: torch.Tensor, v_text: torch.Tensor | None, v_img: torch.Tensor | None,
                    text_scale: float, img_scale: float, renorm_type: str, renorm_min: float) -> torch.Tensor:
    """_forward_flow's combine of packed velocities (N, p*p*C): full, text dropped, image dropped."""
    if text_scale <= 1.0:
        return v
    v_text_ = v_text + text_scale * (v - v_text)
    if renorm_type == "text_channel":
        norm_v, norm_ = v.norm(dim=-1, keepdim=True), v_text_.norm(dim=-1, keepdim=True)
        v_text_ = v_text_ * (norm_v / (norm_ + 1e-8)).clamp(min=renorm_min, max=1.0)
        return v_img + img_scale * (v_text_ - v_img) if img_scale > 1.0 else v_text_
    v_ = v_img + img_scale * (v_text_ - v_img) if img_scale > 1.0 else v_text_
    if renorm_type == "global":
        norm_v, norm_ = v.norm(), v_.norm()
    elif renorm_type == "channel":
        norm_v, norm_ = v.norm(dim=-1, keepdim=True), v_.norm(dim=-1, keepdim=True)
    else:
        raise NotImplementedError(f"{renorm_type} is not supported")
    return v_ * (norm_v / (norm_ + 1e-8)).clamp(min=renorm_min, max=1.0)


@dataclass(frozen=True)
class Context:
    """One of interleave_inference's contexts: per-layer (K, V) after RoPE, as BAGEL's NaiveCache
    holds them (None: empty), and the next RoPE position. Never changed in place: a copy shares it."""

    kv: list | None = None
    rope: int = 0


@dataclass(frozen=True)
class Guidance:
    """generate_image's CFG arguments."""

    text_scale: float
    img_scale: float
    interval: tuple[float, float]
    renorm_type: str = "global"
    renorm_min: float = 0.0


class Bagel:
    """BAGEL's generation calls on DenseBagel: contexts, one branch's velocity, the Euler loop."""

    def __init__(self, weights: dict[str, torch.Tensor], dims: dict) -> None:
        self.lm, self.d, self.p = DenseBagel(weights, dims), dims, dims["latent_patch_size"]

    def _block(self, ctx: Context, middle: torch.Tensor, latent_rows: bool) -> tuple[torch.Tensor, ...]:
        """[soi] + middle + [eoi], all at the context's RoPE position; middle by the generation expert
        when it holds latent rows, else (ViT rows) by the understanding expert."""
        d = self.d
        rows = torch.cat([self.lm.embed([d["start_of_image_id"]]), middle, self.lm.embed([d["end_of_image_id"]])])
        experts = torch.arange(1, len(rows) - 1) if latent_rows else NO_ROWS
        return rows, torch.full((len(rows),), ctx.rope), experts

    def update_context_text(self, ctx: Context, ids: list[int]) -> Context:
        """prepare_prompts + forward_cache_update_text: [bos] + ids + [eos], causal, one position each."""
        rows = self.lm.embed([self.d["bos_token_id"], *ids, self.d["eos_token_id"]])
        _, kv = self.lm.forward(rows, torch.arange(ctx.rope, ctx.rope + len(rows)), NO_ROWS, ctx.kv, True)
        return Context(kv, ctx.rope + len(rows))

    def update_context_image(self, ctx: Context, latent: torch.Tensor, vit_rows: torch.Tensor) -> Context:
        """update_context_image(vae=True, vit=True): the clean latent's block (timestep 0), then the
        ViT rows' block; each block full attention at one RoPE position."""
        for middle, is_latent in ((self.lm.latent_rows(latent, 0.0), True), (vit_rows, False)):
            _, kv = self.lm.forward(*self._block(ctx, middle, is_latent), ctx.kv, False)
            ctx = Context(kv, ctx.rope + 1)
        return ctx

    def update_context_vit(self, ctx: Context, vit_rows: torch.Tensor) -> Context:
        """update_context_image(vae=False, vit=True), understanding's image: the ViT rows' block alone."""
        _, kv = self.lm.forward(*self._block(ctx, vit_rows, False), ctx.kv, False)
        return Context(kv, ctx.rope + 1)

    def gen_text(self, ctx: Context, max_length: int) -> list[int]:
        """gen_text, greedy: from [bos] one token per causal forward, each extending the context; stops at
        max_length tokens (the suite's rows count them all: its requests ignore eos)."""
        token, out = self.d["bos_token_id"], []
        for _ in range(max_length):
            hidden, kv = self.lm.forward(self.lm.embed([token]), torch.tensor([ctx.rope]), NO_ROWS, ctx.kv, True)
            ctx = Context(kv, ctx.rope + 1)
            token = int(F.linear(hidden[-1], self.lm.W["language_model.lm_head.weight"]).argmax())
            out.append(token)
        return out

    def interleave_inference(self, inputs: list) -> tuple[Context, Context, Context]:
        """(full, cfg_text, cfg_img) after `inputs`: token id lists (text) and (latent, ViT rows) pairs."""
        full = cfg_text = cfg_img = Context()
        for item in inputs:
            if isinstance(item, list):
                cfg_text = full
                full, cfg_img = self.update_context_text(full, item), self.update_context_text(cfg_img, item)
            else:
                full = self.update_context_image(full, *item)
                cfg_text = full
        return full, cfg_text, cfg_img

    def velocity(self, ctx: Context, x: torch.Tensor, t: float, h: int, w: int) -> torch.Tensor:
        """One branch of _forward_flow: packed x_t (N, p*p*C) -> packed velocity, the context only read."""
        rows = self.lm.latent_rows(unpack(x, h, w, self.p), t)
        out, _ = self.lm.forward(*self._block(ctx, rows, True), ctx.kv, False)
        return F.linear(out[1:-1], self.lm.W["llm2vae.weight"], self.lm.W["llm2vae.bias"]).float()

    def generate_image(self, contexts: tuple[Context, Context, Context], noise: torch.Tensor, num_timesteps: int,
                       timestep_shift: float, g: Guidance) -> torch.Tensor:
        """generate_image from x at t = 1 (`noise`, (C, h, w)) -> the latent at t = 0, (C, h, w)."""
        full, cfg_text, cfg_img = contexts
        _, h, w = noise.shape
        x = pack(noise, self.p)
        timesteps = torch.linspace(1, 0, num_timesteps)
        timesteps = timestep_shift * timesteps / (1 + (timestep_shift - 1) * timesteps)
        dts = timesteps[:-1] - timesteps[1:]
        for i, step_t in enumerate(timesteps[:-1]):
            # the interval test as BAGEL's, float32 t against the bounds; the embedder reads t exactly
            text_scale, img_scale = effective_scales(step_t, g.text_scale, g.img_scale, g.interval)
            t = float(step_t)
            v = self.velocity(full, x, t, h, w)
            v_text = self.velocity(cfg_text, x, t, h, w) if text_scale > 1.0 else None
            v_img = self.velocity(cfg_img, x, t, h, w) if img_scale > 1.0 else None
            x = x - guided_velocity(v, v_text, v_img, text_scale, img_scale, g.renorm_type, g.renorm_min) * dts[i]
        return unpack(x, h, w, self.p)
