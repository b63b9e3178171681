"""The `audio_gain` family (torch-free): its kind, what `mstarc` needs to know, and the names of its
runtime parts, which only the runtime imports."""
from __future__ import annotations

from mstar_compiler.catalogue import Family, KindSpec, Port

AUDIO_GAIN = KindSpec(
    kind="audio_gain",
    doc="multiplies a waveform by a learned per-channel gain, then clamps to [-1, 1]",
    inputs=(Port("audio", "audio", ("S",)),),
    outputs=(Port("audio", "audio", ("S",)),),
    presets={"tiny": {"channels": 1}, "stereo": {"channels": 2}},
    num_params=lambda dims: dims["channels"],
    is_capture_safe=True,
    args={"initial_gain": 1.0, "fade_samples": 0},
    executor="audio_gain",      # declared by FAMILY below
)

# the entry point of the `mstar.families` group (pyproject.toml)
FAMILY = Family(
    "audio_gain", (AUDIO_GAIN,),
    components={"audio_gain": "mstar_audio_gain.component:AudioGain"},
    executors={"audio_gain": "mstar_audio_gain.executor:fade_in_gain_executor"},
)
