"""whisper_encoder: one 30 s window of 16 kHz audio -> (1500, d_model) rows.

The waveform is padded with silence to 30 s and turned into log-mel features
(runtime/model_executor/log_mel.py: the arithmetic of transformers' WhisperFeatureExtractor), 3,000 frames;
two convolutions (the second of stride 2) with GELU make 1,500 rows, a position table is added, then
pre-norm transformer layers and a final LayerNorm. Parameter names follow transformers'
`WhisperEncoder` (`conv1`, `embed_positions`, `layers.N.self_attn.q_proj`, `layer_norm`), so the
`model.encoder.` part of a published checkpoint loads as is.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from runtime.model_executor.log_mel import log_mel
from runtime.models.whisper.layers import Attention


class _Layer(nn.Module):
    def __init__(self, d: Mapping[str, Any]) -> None:
        super().__init__()
        h, eps = d["d_model"], d["layer_norm_eps"]
        self.self_attn_layer_norm = nn.LayerNorm(h, eps=eps)
        self.self_attn = Attention(h, d["encoder_attention_heads"])
        self.final_layer_norm = nn.LayerNorm(h, eps=eps)
        self.fc1 = nn.Linear(h, d["encoder_ffn_dim"])
        self.fc2 = nn.Linear(d["encoder_ffn_dim"], h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperEncoder(nn.Module):
    """The Whisper encoder node."""
    kind = "whisper_encoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        h = dims["d_model"]
        self.num_mel_bins = dims["num_mel_bins"]
        self.window_samples = dims["chunk_length"] * dims["sampling_rate"]
        self.conv1 = nn.Conv1d(self.num_mel_bins, h, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(h, h, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(dims["max_source_positions"], h)
        self.layers = nn.ModuleList(_Layer(dims) for _ in range(dims["encoder_layers"]))
        self.layer_norm = nn.LayerNorm(h, eps=dims["layer_norm_eps"])

    def features(self, audio: torch.Tensor) -> torch.Tensor:
        """(num_mel_bins, 3000) log-mel of one waveform (S,), S at most one window."""
        if audio.shape[-1] > self.window_samples:
            raise ValueError(f"whisper_encoder reads one window of at most {self.window_samples} samples, "
                             f"got {audio.shape[-1]}")
        return log_mel(F.pad(audio.float(), (0, self.window_samples - audio.shape[-1])), self.num_mel_bins)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel (B, num_mel_bins, 3000) -> (B, 1500, d_model)."""
        x = F.gelu(self.conv1(mel.to(self.conv1.weight.dtype)))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight[:x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)
