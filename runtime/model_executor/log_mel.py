"""Whisper's log-mel features: the input of Whisper's encoder and Qwen3-Omni's audio encoder.

16 kHz waveform -> |STFT|² (n_fft 400, hop 160, Hann window, centred with reflect
padding; the last frame dropped) -> Slaney-scale, Slaney-normalised mel filters over
0..8 kHz -> log10 (floored at 1e-10) -> floored at (max - 8) -> (x + 4) / 4.
The same arithmetic as transformers' WhisperFeatureExtractor on one unpadded waveform,
so one frame is 10 ms and 100 frames are one second of audio.
"""
from __future__ import annotations

import math

import torch

N_FFT = 400
HOP_LENGTH = 160


def _hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    # Slaney: linear below 1 kHz (3 mels per 200 Hz), logarithmic above
    linear = 3.0 * hz / 200.0
    return torch.where(hz >= 1000.0, 15.0 + torch.log(hz / 1000.0) * (27.0 / math.log(6.4)), linear)


def _mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    linear = 200.0 * mel / 3.0
    return torch.where(mel >= 15.0, 1000.0 * torch.exp((math.log(6.4) / 27.0) * (mel - 15.0)), linear)


def mel_filters(num_mel_bins: int, sampling_rate: int = 16000, max_hz: float = 8000.0) -> torch.Tensor:
    """(N_FFT // 2 + 1, num_mel_bins) float64 triangular filters, area-normalised (Slaney)."""
    fft_hz = torch.linspace(0.0, sampling_rate / 2, N_FFT // 2 + 1, dtype=torch.float64)
    edges_mel = torch.linspace(0.0, float(_hz_to_mel(torch.tensor(max_hz, dtype=torch.float64))),
                               num_mel_bins + 2, dtype=torch.float64)
    edges = _mel_to_hz(edges_mel)
    widths = edges.diff()
    slopes = edges[None, :] - fft_hz[:, None]  # (F, M + 2)
    rising = -slopes[:, :-2] / widths[:-1]
    falling = slopes[:, 2:] / widths[1:]
    filters = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return filters * (2.0 / (edges[2:] - edges[:-2]))


def log_mel(waveform: torch.Tensor, num_mel_bins: int, sampling_rate: int = 16000) -> torch.Tensor:
    """(num_mel_bins, frames) features of a mono waveform (S,); frames = S // 160."""
    window = torch.hann_window(N_FFT, device=waveform.device)
    spectrum = torch.stft(waveform.float(), N_FFT, HOP_LENGTH, window=window, return_complex=True)
    power = spectrum[..., :-1].abs() ** 2  # (F, frames)
    filters = mel_filters(num_mel_bins, sampling_rate).to(device=waveform.device, dtype=torch.float32)
    log_spec = torch.clamp(filters.T @ power, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0
