"""Factories shared by the V-JEPA 2 tests: tiny presets and transformers' VJEPA2Model twin."""
from __future__ import annotations

import torch
from transformers import VJEPA2Config, VJEPA2Model

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class


def tiny(kind: str) -> dict:
    return dict(load_catalogue()[kind].presets["tiny"])


def make(kind: str, seed: int = 0, **args) -> torch.nn.Module:
    spec = load_catalogue()[kind]
    torch.manual_seed(seed)
    return component_class(kind)(tiny(kind), {**spec.args, **args}).eval()


def hf_encoder(dims: dict) -> VJEPA2Model:
    """transformers' VJEPA2Model whose encoder has the tiny preset's dimensions."""
    cfg = VJEPA2Config(
        hidden_size=dims["hidden_size"], num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"], mlp_ratio=dims["intermediate_size"] / dims["hidden_size"],
        crop_size=dims["image_size"], patch_size=dims["patch_size"], tubelet_size=dims["tubelet_size"],
        frames_per_clip=4, layer_norm_eps=dims["layer_norm_eps"], pred_hidden_size=32, pred_num_hidden_layers=1,
        pred_num_attention_heads=2, num_pooler_layers=1, attn_implementation="eager")
    return VJEPA2Model(cfg).eval()


def block_causal_mask(num_steps: int, tokens_per_step: int) -> torch.Tensor:
    """V-JEPA 2-AC's `build_action_block_causal_attention_mask`, restated (True = attend)."""
    step = torch.arange(num_steps * tokens_per_step) // tokens_per_step
    return step[None, :] <= step[:, None]


def native_ac_attention(attn, x: torch.Tensor, mask: torch.Tensor, t: int, grid: int) -> torch.Tensor:
    """The published ACRoPEAttention forward restated: conditioning tokens split out and
    rotated on the frame band only, patch tokens on frame/row/col bands, then merged back."""
    from transformers.models.vjepa2.modeling_vjepa2 import rotate_queries_or_keys as rot

    b, n, c = x.shape
    heads, cond, hw = attn.num_heads, 2, grid * grid
    band = 2 * ((c // heads // 3) // 2)
    ids = torch.arange(t * hw)
    d_pos, h_pos, w_pos = (ids // hw).float(), ((ids % hw) // grid).float(), (ids % grid).float()
    x = x.view(b, t, cond + hw, c)
    qkv = attn.qkv(x).unflatten(-1, (3, heads, -1))                     # (B, T, K+HW, 3, heads, D)
    q, k, v = (qkv[..., i, :, :] for i in range(3))
    q_c, k_c, v_c = (z[:, :, :cond].permute(0, 3, 1, 2, 4) for z in (q, k, v))   # (B, heads, T, K, D)
    q_x, k_x, v_x = (z[:, :, cond:].flatten(1, 2).transpose(1, 2) for z in (q, k, v))  # (B, heads, T*HW, D)

    def rotate_cond(z: torch.Tensor) -> torch.Tensor:
        cols = [torch.cat([rot(z[:, :, :, i, :band], pos=torch.arange(t).float()), z[:, :, :, i, band:]], -1)
                for i in range(cond)]
        return torch.stack(cols, dim=3)

    def rotate_patches(z: torch.Tensor) -> torch.Tensor:
        parts = [rot(z[..., i * band:(i + 1) * band], pos=p) for i, p in enumerate((d_pos, h_pos, w_pos))]
        return torch.cat([*parts, z[..., 3 * band:]], -1).view(b, heads, t, hw, -1)

    def merge(zc: torch.Tensor, zx: torch.Tensor) -> torch.Tensor:
        return torch.cat([zc, zx], dim=3).flatten(2, 3)

    q = merge(rotate_cond(q_c), rotate_patches(q_x))
    k = merge(rotate_cond(k_c), rotate_patches(k_x))
    v = merge(v_c, v_x.reshape(b, heads, t, hw, -1))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attn.proj(out.transpose(1, 2).reshape(b, n, c))


def native_ac_forward(pred, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """facebookresearch/vjepa2's VisionTransformerPredictorAC.forward (src/models/ac_predictor.py)
    restated on `pred`'s weights."""
    b, t = actions.shape[:2]
    x = pred.predictor_embed(frames).view(b, t, pred.tokens_per_frame, -1)
    x = torch.cat([pred.action_encoder(actions)[:, :, None], pred.state_encoder(states)[:, :, None], x], 2)
    x = x.flatten(1, 2)
    mask = block_causal_mask(t, pred.tokens_per_step)
    for blk in pred.predictor_blocks:
        x = x + native_ac_attention(blk.attn, blk.norm1(x), mask, t, pred.grid)
        x = x + blk.mlp(blk.norm2(x))
    x = x.view(b, t, pred.tokens_per_step, -1)[:, :, 2:].flatten(1, 2)
    return pred.predictor_proj(pred.predictor_norm(x))


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Give every weight a non-trivial value: unit-gain matrices, LayerNorm gains near 1, small biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(noise / p.shape[1] ** 0.5)
            else:
                p.copy_(noise * 0.1 + (1.0 if torch.all(p == 1) else 0.0))
    return module
