"""A realtime session's audio turned into mel frames while it arrives, cut into Fixed(window) chunks and
normalised by the encoder's executor (floored at the loudest frame so far), equals the whole
utterance's features, and its windows encoded one by one equal the whole encoding."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.components import component_class
from runtime.models.qwen3_omni.mel_featuriser import PCM_RATE, MelFeaturiser
from runtime.models.qwen3_omni.executors import AudioEncoderExecutor
from runtime.entrypoints.http.audio_decode import resample
from runtime.streams.chunk_policy import Chunk
from runtime.transport.messages import WorkItem
from tests.runtime.models.qwen3_omni.omni_reference import preset
from tests.runtime.serving.conftest import REPO

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


def _featuriser(encoder: torch.nn.Module) -> MelFeaturiser:
    return MelFeaturiser(encoder.num_mel_bins)


class EncoderInput(torch.nn.Module):
    """Stands in for the encoder to hand back what the executor feeds it, (F, bins) per window: the
    tiny random encoder's rows barely depend on their input (a 0.25 offset of every mel value moves
    them by 5e-7 of 0.05), so comparing rows could not catch a wrong normalisation."""

    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(0))      # the executor reads the device off a parameter

    def forward(self, mels: list[torch.Tensor]) -> list[torch.Tensor]:
        return [m.T for m in mels]


def _streamed_windows(frames: torch.Tensor, window: int) -> torch.Tensor:
    """What the encoder's executor encodes of the frames (bins, F) arriving on the user_audio stream:
    one Run per Fixed(window) chunk, items one frame each, the last chunk final; (bins, F)."""
    node = compile_file(str(REPO / "graphs" / "qwen3_omni.yaml"), Options(preset="tiny")).plan.node("audio_enc")
    executor, rows = AudioEncoderExecutor(node, EncoderInput()), []
    columns = [{"value": f} for f in frames.unbind(dim=1)]
    for start in range(0, len(columns), window):
        chunk = Chunk(columns[start: start + window], start, 0, start + window >= len(columns))
        rows.append(executor.run([WorkItem(request_id=1)], [{"mel": [chunk]}])[0].outputs["hidden"])
    return torch.cat(rows).T


@pytest.mark.parametrize("seconds", [3.0, 4.37])
@torch.no_grad()
def test_windows_encoded_while_arriving_equal_the_whole(encoder, seconds):
    pcm, window = utterance(seconds), preset(KIND)["n_window_infer"]
    featuriser = _featuriser(encoder)
    early = [featuriser.push(piece) for piece in chunks(pcm)]
    tail = featuriser.finish()
    assert sum(f.shape[1] for f in early) >= window      # a whole window was in before the commit
    assert tail.shape[1] < 0.1 * 100                      # the commit adds at most a chunk's frames (100 per s)
    wave = resample(torch.from_numpy(np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0), PCM_RATE, 16000)
    whole_mel = encoder.features(wave)
    got_mel = _streamed_windows(torch.cat(early + [tail], dim=1), window)
    assert got_mel.shape == whole_mel.shape
    # the same float32 arithmetic on shorter arrays (STFT, resampling convolution): rounding only; measured 6e-8
    assert (got_mel - whole_mel).abs().max() < 1e-4
    whole = encoder([whole_mel])[0]
    got = torch.cat(encoder(list(got_mel.split(window, dim=1))))     # the windows the stream's chunks are
    assert got.shape == whole.shape
    # the same windows through the encoder either way (its attention is windowed): fp32 order differences at most,
    # 1e-4 of the largest value being ~800 eps; measured exact here
    assert (got - whole).abs().max() <= 1e-4 * whole.abs().max()


def test_odd_byte_count_is_refused(encoder):
    with pytest.raises(ValueError, match="even number of bytes"):
        _featuriser(encoder).push(b"\x00\x01\x02")
