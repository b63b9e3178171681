"""qwen3_omni_audio_encoder: Qwen3-Omni's AuT audio encoder, 16 kHz waveform -> thinker-width states.

  waveform -> log-mel (runtime/model_executor/log_mel.py, 100 frames a second)
  -> chunks of 2·n_window = 100 frames, each through three stride-2 Conv2d + GELU and a
     linear `conv_out` (13 tokens per full chunk: 12.5 Hz), plus sinusoidal positions that
     restart in every chunk
  -> transformer encoder layers whose attention stays inside windows of
     13 · (n_window_infer / 100) tokens of one audio (8 s with the published preset)
  -> ln_post, proj1, GELU, proj2 -> (T, output_dim).
Weight names are the checkpoint's `thinker.audio_tower.*` less the prefix (the graph's mapping strips it).

Batching: `forward` takes any number of mel spectrograms and returns one tensor per
audio. Every chunk is zero-padded to the full 100 frames, whatever else is in the batch,
so a batch equals its members run alone. (transformers pads chunks to the longest chunk
of the batch; the two agree whenever the batch holds an audio of at least one second.)
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.log_mel import log_mel
from runtime.models.qwen3_omni.weights import CheckpointWeights, initialise


def cnn_tokens(frames: int) -> int:
    """Tokens that three stride-2 convolutions leave of `frames` mel frames (< one chunk)."""
    for _ in range(3):
        frames = (frames + 1) // 2
    return frames


def sinusoids(length: int, channels: int) -> torch.Tensor:
    """(length, channels) Whisper sinusoidal positions: sines then cosines."""
    increment = math.log(10000) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float32))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_timescales[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=1)


class _Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        w, length, dim = x.shape
        q, k, v = (p(x).view(w, length, self.num_heads, -1).transpose(1, 2)  # (W, heads, L, D)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        return self.out_proj(out.transpose(1, 2).reshape(w, length, dim))


class _EncoderLayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = _Attention(dim, num_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), key_mask)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class Qwen3OmniAudioEncoder(CheckpointWeights, nn.Module):
    kind = "qwen3_omni_audio_encoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        e, c = dims["d_model"], dims["downsample_hidden_size"]
        self.num_mel_bins, self.sampling_rate = dims["num_mel_bins"], dims["sampling_rate"]
        self.chunk = 2 * dims["n_window"]
        self.window = cnn_tokens(self.chunk) * (dims["n_window_infer"] // self.chunk)
        self.register_buffer("positional_embedding", sinusoids(dims["max_source_positions"], e), persistent=False)
        self.layers = nn.ModuleList(
            _EncoderLayer(e, dims["encoder_attention_heads"], dims["encoder_ffn_dim"])
            for _ in range(dims["encoder_layers"]))
        self.ln_post = nn.LayerNorm(e)
        self.conv2d1 = nn.Conv2d(1, c, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, 2, padding=1)
        self.conv_out = nn.Linear(c * cnn_tokens(self.num_mel_bins), e, bias=False)
        self.proj1 = nn.Linear(e, e)
        self.proj2 = nn.Linear(e, dims["output_dim"])
        initialise(self.hf_slots(), args or {})

    def num_tokens(self, frames: int) -> int:
        """Output tokens of an audio of `frames` mel frames."""
        full, rest = divmod(frames, self.chunk)
        return full * cnn_tokens(self.chunk) + cnn_tokens(rest)

    def features(self, waveform: torch.Tensor) -> torch.Tensor:
        """(num_mel_bins, frames) log-mel features of a 16 kHz waveform (S,)."""
        return log_mel(waveform, self.num_mel_bins, self.sampling_rate)

    def encode(self, waveforms: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Waveforms (S_i,) -> hidden states (T_i, output_dim), one per audio."""
        return self([self.features(w) for w in waveforms])

    def forward(self, mels: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Mel features (num_mel_bins, frames_i) -> hidden states (T_i, output_dim), one per audio."""
        tokens = self._embed_chunks(mels)
        windows = [w for t in tokens for w in t.split(self.window)]
        width = max(w.shape[0] for w in windows)
        x = torch.stack([F.pad(w, (0, 0, 0, width - w.shape[0])) for w in windows])  # (W, width, E)
        lengths = torch.tensor([w.shape[0] for w in windows], device=x.device)
        key_mask = torch.arange(width, device=x.device)[None, :] < lengths[:, None]  # (W, width)
        for layer in self.layers:
            x = layer(x, key_mask)
        x = self.proj2(F.gelu(self.proj1(self.ln_post(x[key_mask]))))  # (sum T_i, output_dim)
        return list(x.split([t.shape[0] for t in tokens]))

    def _embed_chunks(self, mels: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per audio, its chunks' convolution tokens with positions: (T_i, d_model)."""
        chunks = [c for mel in mels for c in mel.split(self.chunk, dim=1)]
        x = torch.stack([F.pad(c, (0, self.chunk - c.shape[1])) for c in chunks])[:, None]  # (C, 1, bins, 100)
        for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
            x = F.gelu(conv(x.to(conv.weight.dtype)))
        n, c, f, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(n, t, c * f))  # (C, t, E)
        x = x + self.positional_embedding[:t].to(x.dtype)
        kept = [x[i, : cnn_tokens(chunk.shape[1])] for i, chunk in enumerate(chunks)]
        per_audio = [len(mel.split(self.chunk, dim=1)) for mel in mels]
        groups, start = [], 0
        for count in per_audio:
            groups.append(torch.cat(kept[start: start + count]))
            start += count
        return groups
