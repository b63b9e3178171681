"""Runtime side of `audio_gain`: a torch module built from (dims, args)."""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn


class AudioGain(nn.Module):
    """`audio (S,) -> audio (S,)`: gain * audio, clamped to [-1, 1]."""

    kind = "audio_gain"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any]) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.full((dims["channels"],), float(args.get("initial_gain", 1.0))))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return (audio * self.gain[0]).clamp(-1.0, 1.0)
