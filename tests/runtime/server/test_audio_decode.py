"""Audio bytes in requests: decoding, the length limit read before decoding, resampling."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
import soundfile
import torch

from runtime.entrypoints.http.audio_decode import decode_audio, resample
from runtime.entrypoints.http.errors import ApiError


def _tone(rate: int, seconds: float, hz: float) -> torch.Tensor:
    return torch.sin(2 * math.pi * hz * torch.arange(int(rate * seconds), dtype=torch.float64) / rate)


@pytest.mark.parametrize("orig,new", [(44100, 16000), (8000, 16000), (24000, 16000)])
def test_resampled_tone_is_the_tone_at_the_new_rate(orig, new):
    got = resample(_tone(orig, 1.0, 440.0).float(), orig, new)
    expected = _tone(new, 1.0, 440.0).float()
    assert got.shape == expected.shape
    # away from the edges (the filter's zero padding), within 1e-3: a 16-lobe windowed sinc passes the tone with
    # that much ripple, far above fp32 rounding; measured max |diff| 2.8e-5 (44.1 / 8 / 24 kHz)
    assert (got[300:-300] - expected[300:-300]).abs().max() < 1e-3


def test_stereo_mp3_decodes_to_mono_at_the_asked_rate():
    buf = io.BytesIO()
    wave = np.stack([_tone(24000, 0.5, 300.0).numpy()] * 2, axis=1).astype(np.float32) * 0.5
    soundfile.write(buf, wave, 24000, format="MP3")
    got = decode_audio(buf.getvalue(), "file", 16000, max_seconds=10)
    assert got.ndim == 1 and got.dtype == torch.float32 and abs(got.shape[0] - 8000) < 1200  # MP3 pads frames


def test_too_long_and_undecodable_files_are_refused():
    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(16000 * 3, dtype=np.float32), 16000, format="WAV")
    with pytest.raises(ApiError) as err:
        decode_audio(buf.getvalue(), "file", 16000, max_seconds=2.0)
    assert err.value.status == 413 and "max_audio_seconds" in err.value.message
    with pytest.raises(ApiError) as err:
        decode_audio(b"not audio at all", "file", 16000, max_seconds=2.0)
    assert err.value.status == 400 and err.value.param == "file"
