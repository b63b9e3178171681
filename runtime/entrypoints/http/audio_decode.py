"""Audio files in requests: WAV, MP3, FLAC, OGG bytes -> a mono float waveform at the encoder's rate.

Decoding is libsndfile's (the `soundfile` wheel bundles it, MP3 included), so no system
codec is needed. The length is checked from the file's header before any sample is
decoded. Resampling is band-limited interpolation: a Hann-windowed sinc low-pass at 99%
of the lower Nyquist rate, evaluated as one strided convolution per output phase.
"""
from __future__ import annotations

import base64
import binascii
import io
import math

import numpy as np
import soundfile
import torch
from torch.nn import functional as F

from runtime.entrypoints.http.errors import ApiError

PCM_RATE = 24000         # OpenAI Realtime's pcm16: 16-bit little-endian mono at 24 kHz
ZERO_CROSSINGS = 16      # sinc lobes on each side of a tap: the filter's sharpness
ROLLOFF = 0.99           # cut-off as a fraction of the lower of the two Nyquist rates


def pcm16_bytes(audio: object, field: str) -> bytes:
    """A realtime event's base64 pcm16 (`audio` at `field`), decoded; 400 `invalid_audio` naming the field when
    it is not base64 or holds no whole samples."""
    try:
        data = base64.b64decode(audio, validate=True) if isinstance(audio, str) else None
    except (binascii.Error, ValueError):
        data = None
    if data is None or len(data) % 2:
        raise ApiError(400, f"'{field}' must be base64 pcm16 (24 kHz mono, whole 16-bit samples)", field,
                       "invalid_audio")
    return data


def pcm16_samples(pcm16: bytes) -> torch.Tensor:
    """16-bit little-endian samples -> (S,) float32 in [-1, 1)."""
    return torch.from_numpy(np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0)


def decode_audio(data: bytes, field: str, sample_rate: int, max_seconds: float) -> torch.Tensor:
    """(S,) float32 mono samples at `sample_rate`; 400 if not decodable, 413 if longer than `max_seconds`."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as f:
            seconds = f.frames / f.samplerate
            if seconds > max_seconds:
                raise ApiError(413, f"{field}: the audio lasts {seconds:.1f} s, more than this model's limit of "
                                    f"{max_seconds:g} s (param max_audio_seconds); send a shorter clip", field,
                               "audio_too_long")
            samples, rate = f.read(dtype="float32", always_2d=True), f.samplerate
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise ApiError(400, f"{field}: not a decodable audio file (wav, mp3, flac, ogg): {exc}", field,
                       "invalid_audio") from None
    if samples.shape[0] == 0:
        raise ApiError(400, f"{field}: the audio file holds no samples", field, "invalid_audio")
    mono = torch.from_numpy(np.ascontiguousarray(samples.mean(axis=1)))    # (S,) channels averaged
    return resample(mono, rate, sample_rate)


def resample(wave: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """(S,) samples at `orig_rate` -> (ceil(S * new / orig),) at `new_rate` (module docstring)."""
    g = math.gcd(orig_rate, new_rate)
    orig, new = orig_rate // g, new_rate // g
    if orig == new:
        return wave.float()
    cutoff = min(orig, new) * ROLLOFF                       # in units of the reduced rates
    width = math.ceil(ZERO_CROSSINGS * orig / cutoff)       # input taps on each side
    taps = torch.arange(-width, width + orig, dtype=torch.float64) / orig
    phases = -torch.arange(new, dtype=torch.float64)[:, None] / new
    t = ((phases + taps[None, :]) * cutoff).clamp(-ZERO_CROSSINGS, ZERO_CROSSINGS)  # (new, taps)
    window = torch.cos(t * math.pi / (2 * ZERO_CROSSINGS)) ** 2
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(math.pi * t) / (math.pi * t))
    kernels = (sinc * window * (cutoff / orig)).float()
    x = F.pad(wave.float()[None, None], (width, width + orig))                       # (1, 1, S + pad)
    out = F.conv1d(x, kernels[:, None, :], stride=orig)                              # (1, new, frames)
    length = math.ceil(wave.shape[0] * new / orig)
    return out[0].transpose(0, 1).reshape(-1)[:length]


class StreamResampler:
    """`resample` of a signal that arrives in pieces: `push` returns the output samples whose filter taps
    have all arrived, `finish` the rest; their concatenation is `resample` of the whole (up to float
    rounding of the same arithmetic on shorter arrays). Only the input the next outputs read is kept."""

    def __init__(self, orig_rate: int, new_rate: int) -> None:
        g = math.gcd(orig_rate, new_rate)
        self.orig_rate, self.new_rate = orig_rate, new_rate
        self._orig, self._new = orig_rate // g, new_rate // g
        self._width = math.ceil(ZERO_CROSSINGS * self._orig / (min(self._orig, self._new) * ROLLOFF))
        self._lead = -(-self._width // self._orig)    # output frames of left context, recomputed and dropped
        self._pcm = torch.zeros(0)                    # input from sample `_base` on
        self._base = 0
        self.num_in = 0                               # input samples so far
        self._frames_out = 0                          # output frames (groups of `_new` samples) given

    def push(self, samples: torch.Tensor) -> torch.Tensor:
        self._pcm = torch.cat((self._pcm, samples.float()))
        self.num_in += samples.shape[0]
        stable = (self.num_in - self._width - self._orig) // self._orig + 1
        return self._take(stable, stable * self._orig + self._width)

    def finish(self) -> torch.Tensor:
        given = self._frames_out * self._new
        out = self._take(-(-self.num_in // self._orig), self.num_in)
        return out[: max(0, math.ceil(self.num_in * self._new / self._orig) - given)]

    def _take(self, stable: int, end: int) -> torch.Tensor:
        """The output frames `_frames_out` .. `stable`, reading input up to `end`."""
        if stable <= self._frames_out:
            return torch.zeros(0)
        lead = min(self._frames_out, self._lead)
        start = (self._frames_out - lead) * self._orig
        out = resample(self._pcm[start - self._base: end - self._base], self._orig, self._new)
        keep = out[lead * self._new: (lead + stable - self._frames_out) * self._new]
        self._frames_out = stable
        drop = (stable - min(stable, self._lead)) * self._orig - self._base    # what no later output reads
        self._pcm, self._base = self._pcm[drop:], self._base + drop
        return keep
