"""Silero VAD: a voice activity detector, one speech probability per 32 ms of 16 kHz audio. Torch-free.

The published model (the `silero-vad` package's `data/silero_vad_16k.safetensors`, v6) reads windows
of 512 samples with the 64 samples before each in front: an STFT as a fixed convolution (256-point,
hop 128), four 1-D convolutions, an LSTM cell whose state carries from window to window, and a
1x1 convolution to one logit. It has one shape, so both presets carry it; "tiny" is what graphs get
by default. Its weights ship inside the package, so a node reads them from there
(`package:silero_vad/...`, runtime/model_executor/weights/package_files.py) with or without
`--weights` and `--random-weights`: a detector with random weights would hear nothing.
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, Family, KindSpec, Port

PUBLISHED = "silero-vad-16k"
WEIGHTS = "package:silero_vad/data/silero_vad_16k.safetensors"
_DIMS = {"sample_rate": 16000, "window": 512, "context": 64, "n_fft": 256, "hop": 128, "hidden_size": 128}


def _conv(c_in: int, c_out: int, kernel: int) -> int:
    return c_in * c_out * kernel + c_out


def num_params(d: Dims) -> int:
    """Exact parameter count of the runtime `silero_vad` module."""
    bins, h = d["n_fft"] // 2 + 1, d["hidden_size"]
    stft = (2 * bins) * d["n_fft"]
    convs = _conv(bins, 128, 3) + _conv(128, 64, 3) + _conv(64, 64, 3) + _conv(64, h, 3)
    lstm = 2 * 4 * h * h + 2 * 4 * h
    return stft + convs + lstm + _conv(h, 1, 1)


KINDS = (
    KindSpec(
        kind="silero_vad",
        doc="Silero VAD v6: a speech probability per 512-sample window of 16 kHz audio (streamed, stateful)",
        inputs=(Port("pcm", "audio", ("S",), stream=True),),
        outputs=(Port("speech", "scalar", ("W",)),),
        presets={"tiny": _DIMS, PUBLISHED: _DIMS},
        num_params=num_params,
        args={"weights": WEIGHTS},
        executor="silero_vad",
    ),
)

FAMILY = Family(
    "silero_vad", KINDS,
    components={"silero_vad": "runtime.models.silero_vad.silero_vad:SileroVad"},
    executors={"silero_vad": "runtime.models.silero_vad.silero_vad:vad_executor"},
)
