"""A realtime session's input audio, turned into Qwen3-Omni log-mel frames while it arrives.

The encoder attends only within windows of `n_window_infer` mel frames (its convolutions
within 100-frame chunks, positions restarting in each), so encoding each complete window on
its own gives the rows the whole utterance would give there. `MelFeaturiser` turns appended
24 kHz pcm16 into mel frames as soon as their samples are in:

  pcm16 (24 kHz) -> band-limited resample to 16 kHz (runtime/entrypoints/http/audio_decode.resample),
     a 16 kHz sample kept once every filter tap it reads has arrived
  -> log10 mel frames (runtime/model_executor/log_mel.py's arithmetic), a frame kept once the
     STFT's 400 samples centred on it have arrived (the reflect padding only at the ends);
     `finish()` (the commit) gives the rest.
The frames are the items of the graph's client-fed `user_audio` stream, whose `Fixed(n_window_infer)`
policy cuts them into encoder windows (graphs/qwen3_omni.yaml); the encoder's executor applies the
floor and scale of the published features.

One term of the published features is global: the floor at (loudest frame - 8) in log10 units.
A window released early is floored at the loudest frame *so far*; it equals the whole
utterance's features unless a later frame is louder and this window holds a value more than
80 dB below that later peak (digital silence before a loud word). The rest is exact up to
float rounding of the same arithmetic on shorter arrays
(tests/runtime/models/qwen3_omni/test_mel_featuriser.py states the tolerance).
"""
from __future__ import annotations

import torch

from runtime.model_executor.log_mel import HOP_LENGTH, N_FFT, mel_filters
from runtime.entrypoints.http.audio_decode import PCM_RATE, StreamResampler, pcm16_samples

_HALF = N_FFT // 2         # samples each side of a frame's centre


class MelFeaturiser:
    """One utterance's audio buffer (module docstring); `push` and `finish` return new mel frames."""

    def __init__(self, num_mel_bins: int, sample_rate: int = 16000) -> None:
        self.sample_rate = sample_rate
        self._resampler = StreamResampler(PCM_RATE, sample_rate)
        self._filters = mel_filters(num_mel_bins, sample_rate).float()      # (F, bins)
        self._window = torch.hann_window(N_FFT)
        self._wave = torch.zeros(0)           # the 16 kHz samples final so far
        self._num_mel = 0                     # mel frames computed

    @property
    def seconds(self) -> float:
        return self._resampler.num_in / PCM_RATE

    def push(self, pcm16: bytes) -> torch.Tensor:
        """Append 16-bit little-endian mono samples at 24 kHz; the mel frames now complete,
        (num_mel_bins, n) log10 (unfloored)."""
        if len(pcm16) % 2:
            raise ValueError("pcm16 audio must be whole 16-bit samples (an even number of bytes)")
        self._wave = torch.cat((self._wave, self._resampler.push(pcm16_samples(pcm16))))
        return self._mel(final=False)

    def finish(self) -> torch.Tensor:
        """The utterance ended (commit): the remaining frames (possibly none)."""
        self._wave = torch.cat((self._wave, self._resampler.finish()))
        return self._mel(final=True)

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
