"""vjepa2_ac_predictor: V-JEPA 2-AC's action-conditioned predictor, with a per-frame KV cache.

Input per frame step t: the frame's P patch tokens from the encoder (embed_dim wide), the
action a_t and the end-effector state s_t. Each step becomes P + 2 tokens
[action, state, patch 0 .. patch P-1] (predictor_embed / action_encoder / state_encoder);
pre-norm transformer blocks attend block-causally over steps (a token of step t sees
every token of steps <= t) with 3-axis RoPE whose frame index is the absolute step; the
output drops the 2 conditioning tokens, normalises and projects back to embed_dim. The
output at step t is the prediction of frame t + 1.

Parameter names follow the published V-JEPA 2-AC checkpoint (`predictor_embed`,
`predictor_blocks.0.attn.qkv`, …, `predictor_proj`), including the `extrinsics_encoder`
that the checkpoint carries although the released model does not use it.

`forward(frames, actions, states)` is the native predictor (steps 0 .. n-1 from scratch).
`forward(..., caches=[FrameKVCache per request])` runs only the given new steps of each
request after the steps already in its cache, and appends their keys/values; requests
may hold different numbers of cached steps (padded keys are masked out). Driving it
step by step is `runtime.models.vjepa2.rollout`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.models.vjepa2.frame_cache import FrameKVCache
from runtime.models.vjepa2.layers import Mlp, merge_heads, split_heads
from runtime.models.vjepa2.rope import apply_rope_3d

NUM_COND_TOKENS = 2  # action, state (the released model uses no extrinsics token)
Positions = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
KeysValues = tuple[torch.Tensor, torch.Tensor]


class _ACAttention(nn.Module):
    def __init__(self, hidden: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, pos: Positions, past: KeysValues | None, mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = (split_heads(t, self.num_heads) for t in self.qkv(x).chunk(3, dim=-1))  # (B, heads, N, D)
        q, k = apply_rope_3d(q, *pos), apply_rope_3d(k, *pos)
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(merge_heads(out)), k, v


class _ACBlock(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h, eps = d["hidden_size"], d["layer_norm_eps"]
        self.norm1 = nn.LayerNorm(h, eps=eps)
        self.attn = _ACAttention(h, d["num_attention_heads"])
        self.norm2 = nn.LayerNorm(h, eps=eps)
        self.mlp = Mlp(h, d["intermediate_size"])

    def forward(self, x: torch.Tensor, pos: Positions, past: KeysValues | None, mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, k, v = self.attn(self.norm1(x), pos, past, mask)
        x = x + y
        return x + self.mlp(self.norm2(x)), k, v


class Vjepa2ACPredictor(nn.Module):
    """The V-JEPA 2-AC predictor node (see module docstring)."""
    kind = "vjepa2_ac_predictor"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        h, e, a = dims["hidden_size"], dims["embed_dim"], dims["action_dim"]
        self.grid = dims["image_size"] // dims["patch_size"]
        self.tokens_per_frame = self.grid * self.grid
        self.tokens_per_step = self.tokens_per_frame + NUM_COND_TOKENS
        self.num_heads = dims["num_attention_heads"]
        self.head_dim = h // self.num_heads
        self.args = {"normalize_reps": True, "state_update": "droid_pose", **(args or {})}
        self.predictor_embed = nn.Linear(e, h)
        self.action_encoder = nn.Linear(a, h)
        self.state_encoder = nn.Linear(dims["state_dim"], h)
        self.extrinsics_encoder = nn.Linear(a - 1, h)
        self.predictor_blocks = nn.ModuleList(_ACBlock(dims) for _ in range(dims["num_hidden_layers"]))
        self.predictor_norm = nn.LayerNorm(h, eps=dims["layer_norm_eps"])
        self.predictor_proj = nn.Linear(h, e)

    def new_cache(self, max_steps: int) -> FrameKVCache:
        """An empty KV cache for one request with room for `max_steps` frame steps."""
        p = self.predictor_proj.weight
        return FrameKVCache(len(self.predictor_blocks), self.num_heads, self.head_dim, self.tokens_per_step,
                            max_steps, dtype=p.dtype, device=device_of(self))

    def forward(self, frames: torch.Tensor, actions: torch.Tensor, states: torch.Tensor,
                caches: Sequence[FrameKVCache] | None = None) -> torch.Tensor:
        """frames (B, n*P, embed_dim), actions (B, n, A), states (B, n, S) -> (B, n*P, embed_dim)."""
        b, n = actions.shape[:2]
        if caches is not None and len(caches) != b:
            raise ValueError(f"{len(caches)} KV caches for a batch of {b} requests")
        x = self.predictor_embed(frames).view(b, n, self.tokens_per_frame, -1)      # (B, n, P, D)
        cond = [self.action_encoder(actions)[:, :, None], self.state_encoder(states)[:, :, None]]
        x = torch.cat([*cond, x], dim=2).flatten(1, 2)                               # (B, n*(P+2), D)
        past_steps = [c.num_steps for c in caches] if caches else [0] * b
        pos = self._positions(past_steps, n, x.device)
        mask = self._mask(past_steps, n, x.device)
        for i, block in enumerate(self.predictor_blocks):
            x, k, v = block(x, pos, _gather(caches, i) if max(past_steps) else None, mask)
            for r, cache in enumerate(caches or ()):
                cache.write(i, k[r], v[r])
        for cache in caches or ():
            cache.commit(n)
        x = x.view(b, n, self.tokens_per_step, -1)[:, :, NUM_COND_TOKENS:].flatten(1, 2)  # (B, n*P, D)
        return self.predictor_proj(self.predictor_norm(x))

    def _positions(self, past_steps: list[int], n: int, device: torch.device) -> Positions:
        """Per-token (frame, row, col): frame absolute per request (B, 1, N); row/col (N,), 0 on cond tokens."""
        local = torch.arange(n, device=device, dtype=torch.float32).repeat_interleave(self.tokens_per_step)
        frame = torch.tensor(past_steps, device=device, dtype=torch.float32)[:, None, None] + local  # (B, 1, N)
        cells = torch.arange(self.tokens_per_frame, device=device)
        zeros = torch.zeros(NUM_COND_TOKENS, device=device)
        row = torch.cat([zeros, (cells // self.grid).float()]).repeat(n)
        col = torch.cat([zeros, (cells % self.grid).float()]).repeat(n)
        return frame, row, col

    def _mask(self, past_steps: list[int], n: int, device: torch.device) -> torch.Tensor | None:
        """Boolean (B, 1, N_new, N_past + N_new) block-causal mask; None when nothing is masked."""
        if n == 1 and len(set(past_steps)) == 1:
            return None
        tps = self.tokens_per_step
        q_step = torch.arange(n, device=device).repeat_interleave(tps)                  # (N_new,)
        new = q_step[None, :] <= q_step[:, None]                                         # (N_new, N_new)
        past_len = torch.tensor(past_steps, device=device) * tps                         # (B,)
        past = torch.arange(max(past_steps) * tps, device=device)[None, :] < past_len[:, None]  # (B, N_past)
        mask = torch.cat([past[:, None, :].expand(-1, n * tps, -1), new.expand(len(past_steps), -1, -1)], dim=2)
        return mask[:, None]


def _gather(caches: Sequence[FrameKVCache], layer: int) -> KeysValues:
    """Cached keys/values of one layer for a batch: (B, heads, max_tokens, head_dim), zero-padded."""
    kvs = [cache.keys_values(layer) for cache in caches]
    if len(kvs) == 1:
        return kvs[0][0][None], kvs[0][1][None]
    longest = max(k.shape[1] for k, _ in kvs)
    pad = [(0, 0, 0, longest - k.shape[1]) for k, _ in kvs]
    return (torch.stack([F.pad(k, p) for (k, _), p in zip(kvs, pad)]),
            torch.stack([F.pad(v, p) for (_, v), p in zip(kvs, pad)]))
