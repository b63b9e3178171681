"""Catalogue side of `audio_gain` (torch-free): what `mstarc` needs to know."""
from __future__ import annotations

from mstar_compiler.catalogue import KindSpec, Port

AUDIO_GAIN = KindSpec(
    kind="audio_gain",
    doc="multiplies a waveform by a learned per-channel gain, then clamps to [-1, 1]",
    inputs=(Port("audio", "audio", ("S",)),),
    outputs=(Port("audio", "audio", ("S",)),),
    presets={"tiny": {"channels": 1}, "stereo": {"channels": 2}},
    num_params=lambda dims: dims["channels"],
    is_capture_safe=True,
    args={"initial_gain": 1.0, "fade_samples": 0},
    executor="audio_gain",      # mstar_audio_gain.executor, through the mstar.executors entry point
)


def kinds() -> tuple[KindSpec, ...]:
    """Entry point of the `mstar.catalogue` group."""
    return (AUDIO_GAIN,)
