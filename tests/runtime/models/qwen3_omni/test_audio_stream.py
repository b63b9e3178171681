"""A realtime session's audio turned into mel frames while it arrives, cut into encoder windows and
floored at the loudest frame so far (as the encoder's executor does with the user_audio stream's
chunks), equals the whole utterance's features and encoding."""
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
    return AudioStream(encoder.num_mel_bins)


def _windows(frames: list[torch.Tensor], window: int) -> list[torch.Tensor]:
    """Fixed(window) windows of the frames, each floored at the loudest value up to its end (the
    executor's normalisation of a streamed chunk, runtime/models/qwen3_omni/executors.py)."""
    log_mel, out, loudest = torch.cat(frames, dim=1), [], -float("inf")
    for w in log_mel.split(window, dim=1):
        loudest = max(loudest, float(w.max()))
        out.append((torch.maximum(w, torch.tensor(loudest - 8.0)) + 4.0) / 4.0)
    return out


@pytest.mark.parametrize("seconds", [3.0, 4.37])
@torch.no_grad()
def test_windows_encoded_while_arriving_equal_the_whole(encoder, seconds):
    pcm, window = utterance(seconds), preset(KIND)["n_window_infer"]
    stream = _stream(encoder)
    early = [stream.push(piece) for piece in chunks(pcm)]
    tail = stream.finish()
    assert sum(f.shape[1] for f in early) >= window      # a whole window was in before the commit
    assert tail.shape[1] < 0.1 * 100                      # the commit adds at most a chunk's frames (100 per s)
    wave = resample(torch.from_numpy(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0), PCM_RATE, 16000)
    whole_mel = encoder.features(wave)
    windows = _windows(early + [tail], window)
    got_mel = torch.cat(windows, dim=1)
    assert got_mel.shape == whole_mel.shape
    # the same float32 arithmetic on shorter arrays (STFT, resampling convolution): rounding only
    assert (got_mel - whole_mel).abs().max() < 1e-4
    whole = encoder([whole_mel])[0]
    got = torch.cat(encoder(windows))
    assert got.shape == whole.shape
    assert (got - whole).abs().max() <= 1e-4 * whole.abs().max()


def test_odd_byte_count_is_refused(encoder):
    with pytest.raises(ValueError, match="even number of bytes"):
        _stream(encoder).push(b"\x00\x01\x02")
