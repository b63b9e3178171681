"""Causal convolution blocks of Qwen3-Omni's code2wav vocoder (weight names as the checkpoint's).

Everything here is causal in time: an output sample never depends on a later input,
which is what lets code2wav decode a stream chunk by chunk with left context
(`runtime/models/qwen3_omni/qwen3_omni_code2wav.py`). Tensors are (B, C, T) throughout.

The transposed convolutions of the decoder have kernel 2·stride; of the raw output they
drop `kernel - stride` samples on the left (alignment) and as many on the right: the
right-hand ones still wait for overlap-add contributions of the next input frame. That is
why T frames decode to fewer than T·1920 samples (`num_samples` in the component).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CausalConv(nn.Module):
    """Conv1d with stride 1, left-padded so that output t sees inputs <= t."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.left_pad = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.left_pad, 0)))


class CausalTransConv(nn.Module):
    """ConvTranspose1d that trims `kernel - stride` samples from both ends of its output."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., self.trim: y.shape[-1] - self.trim]


class SnakeBeta(nn.Module):
    """x + sin²(x·e^alpha) / e^beta, with per-channel log-scale alpha and beta."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]  # (1, C, 1)
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv, LayerNorm, 4x pointwise MLP, layer-scaled residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).transpose(1, 2)  # (B, T, C)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).transpose(1, 2)


class ResidualUnit(nn.Module):
    """Snake, dilated causal conv (kernel 7), snake, 1x1 conv, residual."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    """Snake, transposed conv upsampling by `rate` (halving channels), three residual units."""

    def __init__(self, c_in: int, c_out: int, rate: int) -> None:
        super().__init__()
        units: list[nn.Module] = [SnakeBeta(c_in), CausalTransConv(c_in, c_out, 2 * rate, rate)]
        units += [ResidualUnit(c_out, dilation) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList(units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.block:
            x = unit(x)
        return x
