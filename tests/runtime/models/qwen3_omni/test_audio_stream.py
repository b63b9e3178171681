"""A realtime session's audio encoded window by window while it arrives equals the whole utterance encoded once."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.components import component_class
from runtime.models.qwen3_omni.audio_stream import PCM_RATE, AudioStream
from runtime.server.audio_decode import resample
from tests.runtime.models.qwen3_omni.omni_reference import preset

KIND = "qwen3_omni_audio_encoder"
CHUNK_S = 0.1


def utterance(seconds: float, seed: int = 0) -> bytes:
    """pcm16 at 24 kHz: a gliding tone over noise (no frame 80 dB below the peak: the floor never acts)."""
    t = np.arange(int(PCM_RATE * seconds)) / PCM_RATE
    wave = 0.3 * np.sin(2 * np.pi * (300 + 200 * t) * t) + 0.05 * np.random.default_rng(seed).standard_normal(t.shape)
    return (np.clip(wave, -1, 1) * 32767).astype("<i2").tobytes()


def chunks(pcm: bytes, seconds: float = CHUNK_S) -> list[bytes]:
    step = 2 * int(PCM_RATE * seconds)
    return [pcm[i: i + step] for i in range(0, len(pcm), step)]


@pytest.fixture(scope="module")
def encoder() -> torch.nn.Module:
    torch.manual_seed(0)
    return component_class(KIND)(preset(KIND), {}).eval()


def _stream(encoder: torch.nn.Module) -> AudioStream:
    return AudioStream(encoder.num_mel_bins, preset(KIND)["n_window_infer"])


@pytest.mark.parametrize("seconds", [3.0, 4.37])
@torch.no_grad()
def test_windows_encoded_while_arriving_equal_the_whole(encoder, seconds):
    pcm = utterance(seconds)
    stream = _stream(encoder)
    early = [w for piece in chunks(pcm) for w in stream.push(piece)]
    tail = stream.finish()
    assert early and all(w.shape[1] == stream.window_frames for w in early)   # windows ran before the commit
    assert sum(w.shape[1] for w in early + tail) < stream.window_frames * (len(early) + 1)
    wave = resample(torch.from_numpy(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0), PCM_RATE, 16000)
    whole_mel = encoder.features(wave)
    got_mel = torch.cat(early + tail, dim=1)
    assert got_mel.shape == whole_mel.shape
    # the same float32 arithmetic on shorter arrays (STFT, resampling convolution): rounding only
    assert (got_mel - whole_mel).abs().max() < 1e-4
    whole = encoder([whole_mel])[0]
    got = torch.cat(encoder(early + tail))
    assert got.shape == whole.shape
    assert (got - whole).abs().max() <= 1e-4 * whole.abs().max()


def test_odd_byte_count_is_refused(encoder):
    with pytest.raises(ValueError, match="even number of bytes"):
        _stream(encoder).push(b"\x00\x01\x02")
