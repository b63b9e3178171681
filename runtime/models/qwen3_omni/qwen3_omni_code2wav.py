"""qwen3_omni_code2wav: Qwen3-Omni's causal codec decoder, frames of codes -> 24 kHz audio.

Pipeline (weight names as the checkpoint's `code2wav.*` with the prefix the graph's mapping strips):
  codes (B, Q, F) -> mean of Q codebook embeddings -> sliding-window causal transformer
  -> 2 x (causal transposed conv + ConvNeXt) upsampling -> causal conv -> 4 decoder blocks
  (snake + transposed conv by 8, 5, 4, 3 + residual units) -> snake -> conv -> clamp.
One frame is 2·2·8·5·4·3 = 1920 samples, but the decoder's transposed convolutions keep
back a fixed tail that still waits for the next frame: F frames give
`num_samples(F)` = 1920·F − 555 samples with the published rates.

Streaming (the graph's `left_context: {chunk: 25, context: 25}` edge): `decode_chunks`
decodes each request's chunk with its left-context frames and returns exactly the samples
the previous chunks have not: local samples [num_samples(c), num_samples(c + n)) of a chunk
with c context and n new frames. Because the model is causal and RoPE is relative, the
concatenated stream equals the unchunked decode wherever the model's receptive field fits
in the context (the tiny preset; tests/runtime/qwen3_omni/test_code2wav.py). Unlike
transformers' `chunked_decode`, which drops the 555 held-back samples at every chunk
boundary, no audio is lost between chunks.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.layers.norm import RMSNorm
from runtime.model_executor.layers.rotary import RotaryEmbedding
from runtime.models.qwen3_omni.codec_layers import CausalConv, CausalTransConv, ConvNeXtBlock, DecoderBlock, SnakeBeta
from runtime.models.qwen3_omni.weights import CheckpointWeights, initialise


class _Attention(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h, self.num_heads, self.num_kv_heads = d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"]
        self.head_dim = h // self.num_heads
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, rotary: RotaryEmbedding, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)  # (B, T, H, D)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        q, k = rotary(torch.arange(t, device=x.device), q, k)  # positions restart at 0 in every call
        repeat = self.num_heads // self.num_kv_heads
        k, v = (z.repeat_interleave(repeat, dim=2) for z in (k, v))
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))  # (B, T, H*D)


class _LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class _SwiGLU(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, inner, bias=False)
        self.up_proj = nn.Linear(dim, inner, bias=False)
        self.down_proj = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _TransformerLayer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h, eps = d["hidden_size"], d["rms_norm_eps"]
        self.input_layernorm = RMSNorm(h, eps)
        self.self_attn = _Attention(d)
        self.self_attn_layer_scale = _LayerScale(h, d["layer_scale_initial_scale"])
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = _SwiGLU(h, d["intermediate_size"])
        self.mlp_layer_scale = _LayerScale(h, d["layer_scale_initial_scale"])

    def forward(self, x: torch.Tensor, rotary: RotaryEmbedding, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rotary, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class _PreTransformer(nn.Module):
    """Sliding-window causal transformer over frame embeddings (positions restart at 0 per call)."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_TransformerLayer(d) for _ in range(d["num_hidden_layers"]))
        self.norm = RMSNorm(d["hidden_size"], d["rms_norm_eps"])
        self.window = d["sliding_window"]
        self.rotary_emb = RotaryEmbedding(d["hidden_size"] // d["num_attention_heads"], float(d["rope_theta"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        lag = pos[:, None] - pos[None, :]  # (T_query, T_key)
        mask = (lag >= 0) & (lag < self.window)
        for layer in self.layers:
            x = layer(x, self.rotary_emb, mask)
        return self.norm(x)


class Qwen3OmniCode2Wav(CheckpointWeights, nn.Module):
    """Codec frames (B, Q, F) -> waveform (B, num_samples(F)) at 24 kHz."""
    kind = "qwen3_omni_code2wav"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        h, q = dims["hidden_size"], dims["num_quantizers"]
        self.num_quantizers, self.codebook_size = q, dims["codebook_size"]
        self.ratios, self.rates = tuple(dims["upsampling_ratios"]), tuple(dims["upsample_rates"])
        self.code_embedding = nn.Embedding(self.codebook_size * q, h)
        self.pre_transformer = _PreTransformer(dims)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(h, h, r, r), ConvNeXtBlock(h)]) for r in self.ratios
        )
        c = dims["decoder_dim"]
        blocks: list[nn.Module] = [CausalConv(h, c, 7)]
        blocks += [DecoderBlock(c >> i, c >> (i + 1), r) for i, r in enumerate(self.rates)]
        c_last = c >> len(self.rates)
        self.decoder = nn.ModuleList([*blocks, SnakeBeta(c_last), CausalConv(c_last, 1, 7)])
        initialise(self.hf_slots(), args or {})

    def num_samples(self, num_frames: int) -> int:
        """Samples that `num_frames` frames decode to (0 for 0 frames)."""
        length = num_frames
        for ratio in self.ratios:
            length *= ratio
        for rate in self.rates:
            length = max(length - 1, 0) * rate
        return length

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, Q, F) int64 -> audio (B, num_samples(F)) float in [-1, 1]."""
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(f"code2wav expects {self.num_quantizers} codebooks per frame, got {codes.shape[1]}")
        offsets = torch.arange(self.num_quantizers, device=codes.device)[None, :, None] * self.codebook_size
        x = self.code_embedding(codes + offsets).mean(1)  # (B, F, H)
        x = self.pre_transformer(x).transpose(1, 2)  # (B, H, F)
        for blocks in self.upsample:
            for block in blocks:
                x = block(x)
        for block in self.decoder:
            x = block(x)
        return x.squeeze(1).clamp(-1.0, 1.0)  # (B, S)

    def decode_chunks(self, chunks: Sequence[torch.Tensor], num_context: Sequence[int]) -> list[torch.Tensor]:
        """Decode one streamed chunk per request; return each request's new samples.

        chunks[i]: (F_i, Q) frames, the first num_context[i] of which were delivered
        before (left context). On a GPU, chunks of different lengths are right-padded into
        one batch, which changes nothing on the left because every layer is causal. On a
        CPU each chunk is decoded alone, at its own length: the upsampling convolutions'
        activations of a batch outgrow the caches, and a batch of chunks took longer per
        frame than the same chunks one by one (docs/benchmark-log.md, "Qwen3-Omni at full
        width"). A final chunk may hold no new frames (the stream ended on a chunk
        boundary): no samples.
        """
        if len(chunks) > 1 and chunks[0].device.type == "cpu":
            return [self.decode_chunks([chunk], [c])[0] for chunk, c in zip(chunks, num_context)]
        longest = max(chunk.shape[0] for chunk in chunks)
        if longest == 0:
            return [torch.zeros(0, device=chunk.device) for chunk in chunks]
        batch = torch.zeros(len(chunks), longest, self.num_quantizers, dtype=torch.long, device=chunks[0].device)
        for i, chunk in enumerate(chunks):
            batch[i, : chunk.shape[0]] = chunk
        audio = self.forward(batch.transpose(1, 2))  # (B, S)
        return [
            audio[i, self.num_samples(c): self.num_samples(chunk.shape[0])]
            for i, (chunk, c) in enumerate(zip(chunks, num_context))
        ]
