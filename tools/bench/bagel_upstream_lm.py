"""A dense, unbatched BAGEL LM restated from ByteDance-Seed/Bagel's `modeling/bagel/qwen2_navit.py`.

The oracle for `bagel_mot_lm`: no paging, no packing, one sequence at a time, every
tensor read by its BAGEL checkpoint name from a plain dict. Rows listed in `gen_rows`
use the `_moe_gen` weights ("gen" mode), the others the understanding weights; the
context is a list of per-layer (K, V) after RoPE, as BAGEL's NaiveCache holds them.
Rows compute in the weights' dtype (fp32 for the tests, bf16 for the `bagel-wide` suite's peer, as
BAGEL runs): RoPE, the timestep embedding and the sin-cos tables in fp32, cast to it, as BAGEL's own.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


def bagel_sincos_table(embed_dim: int, grid_size: int) -> torch.Tensor:
    """BAGEL's get_2d_sincos_pos_embed, transcribed with numpy."""
    def one_d(dim, pos):
        omega = np.arange(dim // 2, dtype=np.float64)
        omega /= dim / 2.0
        omega = 1.0 / 10000 ** omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size, grid_size])
    emb = np.concatenate([one_d(embed_dim // 2, grid[0]), one_d(embed_dim // 2, grid[1])], axis=1)
    return torch.from_numpy(emb).float()


def bagel_timestep_embedding(W: dict, t: torch.Tensor, dim: int = 256) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(start=0, end=half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    h = F.linear(emb.to(W["time_embedder.mlp.0.weight"].dtype), W["time_embedder.mlp.0.weight"],
                 W["time_embedder.mlp.0.bias"])
    return F.linear(F.silu(h), W["time_embedder.mlp.2.weight"], W["time_embedder.mlp.2.bias"])


def _rms(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    freqs = pos.float()[:, None] * inv[None]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    rotated = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return (x * emb.cos() + rotated * emb.sin()).to(x.dtype)


class DenseBagel:
    def __init__(self, W: dict, dims: dict) -> None:
        self.W, self.d = W, dims

    def _by_expert(self, x, gen_rows, fn):
        """fn(x_rows, suffix) per expert, merged like BAGEL's packed_*[indexes] = ..."""
        n = x.shape[0]
        und_rows = torch.tensor(sorted(set(range(n)) - set(gen_rows.tolist())), dtype=torch.long)
        und = fn(x[und_rows], "")
        out = x.new_zeros((n, *und.shape[1:]))
        out[und_rows] = und
        if len(gen_rows):
            out[gen_rows] = fn(x[gen_rows], "_moe_gen")
        return out

    def _layer(self, i, x, pos, gen_rows, ctx_kv, causal):
        W, d, p = self.W, self.d, f"language_model.model.layers.{i}."
        eps, hd = d["rms_norm_eps"], d["head_dim"]

        def lin(r, name):
            return F.linear(r, W[f"{p}{name}.weight"], W.get(f"{p}{name}.bias"))

        normed = self._by_expert(x, gen_rows, lambda r, s: _rms(r, W[f"{p}input_layernorm{s}.weight"], eps))
        q = self._by_expert(normed, gen_rows, lambda r, s: lin(r, f"self_attn.q_proj{s}")).view(len(x), -1, hd)
        k = self._by_expert(normed, gen_rows, lambda r, s: lin(r, f"self_attn.k_proj{s}")).view(len(x), -1, hd)
        v = self._by_expert(normed, gen_rows, lambda r, s: lin(r, f"self_attn.v_proj{s}")).view(len(x), -1, hd)
        if d["qk_norm"]:
            q = self._by_expert(q, gen_rows, lambda r, s: _rms(r, W[f"{p}self_attn.q_norm{s}.weight"], eps))
            k = self._by_expert(k, gen_rows, lambda r, s: _rms(r, W[f"{p}self_attn.k_norm{s}.weight"], eps))
        q, k = _rope(q, pos, d["rope_theta"]), _rope(k, pos, d["rope_theta"])
        keys = torch.cat([ctx_kv[0], k]) if ctx_kv else k
        values = torch.cat([ctx_kv[1], v]) if ctx_kv else v
        group = q.shape[1] // keys.shape[1]
        kk, vv = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(hd)
        if causal:
            c = len(keys) - len(x)
            mask = torch.arange(len(keys))[None] > (torch.arange(len(x)) + c)[:, None]
            scores = scores.masked_fill(mask, float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(len(x), -1)
        x = x + self._by_expert(attn, gen_rows, lambda r, s: lin(r, f"self_attn.o_proj{s}"))

        def mlp(r, s):
            r = _rms(r, W[f"{p}post_attention_layernorm{s}.weight"], eps)
            gate, up = lin(r, f"mlp{s}.gate_proj"), lin(r, f"mlp{s}.up_proj")
            return lin(F.silu(gate) * up, f"mlp{s}.down_proj")

        return x + self._by_expert(x, gen_rows, mlp), (keys, values)

    def forward(self, x, pos, gen_rows, context, causal):
        """x (n, hidden) input rows -> final-normed rows and the new per-layer context."""
        new_context = []
        for i in range(self.d["num_hidden_layers"]):
            x, kv = self._layer(i, x, pos, gen_rows, context[i] if context else None, causal)
            new_context.append(kv)
        m = "language_model.model."
        x = self._by_expert(x, gen_rows, lambda r, s: _rms(r, self.W[f"{m}norm{s}.weight"], self.d["rms_norm_eps"]))
        return x, new_context

    def embed(self, ids):
        return self.W["language_model.model.embed_tokens.weight"][torch.as_tensor(ids)]

    def latent_rows(self, latent, t):
        """BAGEL's packing of a (C, h, w) latent into vae2llm + timestep + position rows."""
        d, p = self.d, self.d["latent_patch_size"]
        c, h, w = latent.shape
        packed = torch.einsum("chpwq->hwpqc", latent.reshape(c, h // p, p, w // p, p)).reshape(-1, p * p * c)
        ids = (torch.arange(h // p)[:, None] * d["max_latent_size"] + torch.arange(w // p)).flatten()
        pos = bagel_sincos_table(d["hidden_size"], d["max_latent_size"])[ids]
        emb = bagel_timestep_embedding(self.W, torch.tensor([t]), d["timestep_embedding_dim"])
        w = self.W["vae2llm.weight"]
        return F.linear(packed.to(w.dtype), w, self.W["vae2llm.bias"]) + emb + pos.to(w.dtype)

    def unpack_velocity(self, rows, h, w):
        p, c = self.d["latent_patch_size"], self.d["latent_channels"]
        v = F.linear(rows, self.W["llm2vae.weight"], self.W["llm2vae.bias"]).float()
        return torch.einsum("hwpqc->chpwq", v.reshape(h // p, w // p, p, p, c)).reshape(c, h, w)


def siglip_twin(vit_state: dict, dims: dict, attn: str = "eager"):
    """transformers' SiglipVisionModel holding a `siglip_vit` tower's weights (full grid images only:
    its learned positions are looked up for every patch of the max_num_patch_per_side square)."""
    from transformers import SiglipVisionConfig, SiglipVisionModel

    side, p = dims["max_num_patch_per_side"], dims["patch_size"]
    config = SiglipVisionConfig(
        hidden_size=dims["hidden_size"], intermediate_size=dims["intermediate_size"],
        num_hidden_layers=dims["num_hidden_layers"], num_attention_heads=dims["num_attention_heads"],
        image_size=side * p, patch_size=p, layer_norm_eps=dims["layer_norm_eps"], attn_implementation=attn)
    hf = SiglipVisionModel(config).eval()
    prefix = "vit_model.vision_model."
    tower = {k.removeprefix(prefix): v for k, v in vit_state.items() if k.startswith(prefix)}
    linear = tower["embeddings.patch_embedding.weight"]        # BAGEL's (D, p*p*C) Linear form
    tower["embeddings.patch_embedding.weight"] = linear.reshape(len(linear), p, p, -1).permute(0, 3, 1, 2)
    hf.load_state_dict({**hf.state_dict(), **tower})
    return hf


def vit_context_rows(vit_state: dict, dims: dict, pixels: torch.Tensor) -> torch.Tensor:
    """BAGEL's ViT tokens for one full-grid image (3, H, W) in [-1, 1]: SigLIP, then the connector
    (fc1, GELU-tanh, fc2), plus the 2-D sin-cos table at each patch's flattened (row, col) id."""
    with torch.no_grad():
        hidden = siglip_twin(vit_state, dims)(pixel_values=pixels[None]).last_hidden_state[0]
    h = F.gelu(F.linear(hidden, vit_state["connector.fc1.weight"], vit_state["connector.fc1.bias"]),
               approximate="tanh")
    rows = F.linear(h, vit_state["connector.fc2.weight"], vit_state["connector.fc2.bias"])
    side = dims["max_num_patch_per_side"]
    return rows + bagel_sincos_table(dims["llm_hidden_size"], side)[torch.arange(side * side)]
