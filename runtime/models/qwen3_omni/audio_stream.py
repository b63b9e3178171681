"""A realtime session's input audio, cut into Qwen3-Omni audio-encoder windows while it arrives.

The encoder attends only within windows of `n_window_infer` mel frames (its convolutions
within 100-frame chunks, positions restarting in each), so encoding each complete window on
its own gives the rows the whole utterance would give there. `AudioStream` turns appended
24 kHz pcm16 into those windows as soon as their samples are in:

  pcm16 (24 kHz) -> band-limited resample to 16 kHz (runtime/server/audio_decode.resample),
     a 16 kHz sample kept once every filter tap it reads has arrived
  -> log-mel frames (runtime/models/qwen3_omni/mel.py's arithmetic), a frame kept once the
     STFT's 400 samples centred on it have arrived (the reflect padding only at the ends)
  -> a `Fixed(n_window_infer)` chunk policy over the frames (runtime/streams/chunk_policy.py):
     each release is one window for the encoder; `finish()` flushes the tail (the commit).

One term of the published features is global: the floor at (loudest frame - 8) in log10 units.
A window released early is floored at the loudest frame *so far*; it equals the whole
utterance's features unless a later frame is louder and this window holds a value more than
80 dB below that later peak (digital silence before a loud word). The rest is exact up to
float rounding of the same arithmetic on shorter arrays
(tests/runtime/models/qwen3_omni/test_audio_stream.py states the tolerance).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from runtime.models.qwen3_omni.mel import HOP_LENGTH, N_FFT, mel_filters
from runtime.server.audio_decode import ROLLOFF, ZERO_CROSSINGS, resample
from runtime.streams.chunk_policy import Fixed, StreamBuffer

PCM_RATE = 24000           # OpenAI Realtime's pcm16 input: 16-bit little-endian mono at 24 kHz
_HALF = N_FFT // 2         # samples each side of a frame's centre


class AudioStream:
    """One session's audio buffer (module docstring); `push` and `finish` return mel windows."""

    def __init__(self, num_mel_bins: int, window_frames: int, sample_rate: int = 16000) -> None:
        self.sample_rate, self.window_frames = sample_rate, window_frames
        g = math.gcd(PCM_RATE, sample_rate)
        self._orig, self._new = PCM_RATE // g, sample_rate // g
        self._width = math.ceil(ZERO_CROSSINGS * self._orig / (min(self._orig, self._new) * ROLLOFF))
        self._filters = mel_filters(num_mel_bins, sample_rate).float()      # (F, bins)
        self._window = torch.hann_window(N_FFT)
        self._pcm = torch.zeros(0)            # every input sample so far, float in [-1, 1)
        self._wave = torch.zeros(0)           # the 16 kHz samples final so far
        self._num_frames_out = 0              # resampler output frames (groups of `_new` samples) kept
        self._num_mel = 0                     # mel frames computed
        self._loudest = -math.inf             # the largest log10 mel value so far (the floor's reference)
        self._frames: StreamBuffer[torch.Tensor] = StreamBuffer(Fixed(window_frames), window_frames)

    @property
    def seconds(self) -> float:
        return self._pcm.shape[0] / PCM_RATE

    def push(self, pcm16: bytes) -> list[torch.Tensor]:
        """Append 16-bit little-endian mono samples at 24 kHz; the windows now complete, each
        (num_mel_bins, window_frames) normalised log-mel."""
        if len(pcm16) % 2:
            raise ValueError("pcm16 audio must be whole 16-bit samples (an even number of bytes)")
        samples = torch.from_numpy(np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0)
        self._pcm = torch.cat((self._pcm, samples))
        self._resample(final=False)
        return self._release(self._mel(final=False))

    def finish(self) -> list[torch.Tensor]:
        """The utterance ended (commit): the remaining windows, the last one shorter (possibly none)."""
        self._resample(final=True)
        windows = self._release(self._mel(final=True))
        self._frames.finish()
        tail = self._frames.take()
        if tail is not None and tail.new_items:
            windows.append(self._normalise(torch.stack(tail.new_items, dim=1)))
        return windows

    # ---- 24 kHz -> 16 kHz ----------------------------------------------------------------

    def _resample(self, final: bool) -> None:
        """Extend `_wave` by the resampler frames whose taps have all arrived (all of them if final)."""
        orig, new, width, n_in = self._orig, self._new, self._width, self._pcm.shape[0]
        stable = (n_in - width - orig) // orig + 1 if not final else math.ceil(n_in / orig)
        if stable <= self._num_frames_out:
            return
        lead = min(self._num_frames_out, -(-width // orig))    # frames of left context, recomputed and dropped
        start = (self._num_frames_out - lead) * orig
        out = resample(self._pcm[start: n_in if final else stable * orig + width], PCM_RATE, self.sample_rate)
        keep = out[lead * new: (lead + stable - self._num_frames_out) * new]
        self._wave = torch.cat((self._wave, keep))
        if final:
            self._wave = self._wave[: math.ceil(n_in * new / orig)]   # as `resample` cuts the whole
        self._num_frames_out = stable

    # ---- 16 kHz -> log-mel -------------------------------------------------------------

    def _mel(self, final: bool) -> torch.Tensor:
        """(bins, n) log10 mel of the frames now computable (unfloored)."""
        wave, a = self._wave, self._num_mel
        total = wave.shape[0] // HOP_LENGTH if final else (wave.shape[0] - _HALF) // HOP_LENGTH + 1
        if total <= a or wave.shape[0] <= _HALF:
            return torch.zeros(self._filters.shape[1], 0)
        start = max(0, a * HOP_LENGTH - _HALF)
        seg = wave[start: wave.shape[0] if final else (total - 1) * HOP_LENGTH + _HALF]
        pads = (_HALF if a == 0 else 0, _HALF if final else 0)
        seg = torch.nn.functional.pad(seg[None, None], pads, mode="reflect")[0, 0]
        spectrum = torch.stft(seg, N_FFT, HOP_LENGTH, window=self._window, center=False, return_complex=True)
        power = spectrum[..., : total - a].abs() ** 2                                # (F, n)
        self._num_mel = total
        return torch.clamp(self._filters.T @ power, min=1e-10).log10()

    def _release(self, log_mel: torch.Tensor) -> list[torch.Tensor]:
        if log_mel.shape[1]:
            self._loudest = max(self._loudest, float(log_mel.max()))
        windows = []
        for column in log_mel.unbind(dim=1):
            self._frames.push(column)
            chunk = self._frames.take()
            if chunk is not None:
                windows.append(self._normalise(torch.stack(chunk.new_items, dim=1)))
        return windows

    def _normalise(self, log_mel: torch.Tensor) -> torch.Tensor:
        return (torch.maximum(log_mel, torch.tensor(self._loudest - 8.0)) + 4.0) / 4.0
