"""The `silero_vad` node against the silero-vad package's own model, on real speech, noise and silence.

The oracle is the package's TorchScript model (`data/silero_vad.jit`, what `silero_vad.load_silero_vad()`
returns), run window by window as its docs stream audio (its own state and 64-sample context). It is
loaded straight from the installed package's files, not through `import silero_vad`, whose import sets
torch's thread count to 1 for the whole process. Two checks:
  * the package's model with its own weights, against our module with the same tensors written into a
    safetensors file under the published names: the architecture, step by step with its state;
  * the package's model with the published `silero_vad_16k.safetensors` copied into its parameters,
    against our node loading that file as published (`package:` reference): the file served.
The package ships different trained weights in the two files (silero-vad 6.2.3: the jit's tensors are not the
safetensors'), so each side runs on the same tensors as its oracle.
Speech is Debian's espeak-ng (installed by .ci/run); without it the tests skip, saying so.
"""
from __future__ import annotations

import importlib.util
import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from safetensors.torch import save_file

from mstar_compiler.catalogue import load_catalogue
from runtime.entrypoints.http.audio_decode import resample
from runtime.model_executor.components import component_class
from runtime.model_executor.weights import load_safetensors
from runtime.models.silero_vad.silero_vad import VadExecutor
from runtime.streams.chunk_policy import Chunk
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams

SPEC = load_catalogue()["silero_vad"]
DIMS = SPEC.presets["tiny"]
WINDOW = DIMS["window"]
# fp32 throughout; the same convolutions and LSTM cell as the oracle's, but batched rows and another
# op order (the jit's fused LSTM): rounding of ~1e-6 in the logits, amplified by nothing (a sigmoid's
# slope is at most 1/4)
ATOL = 1e-5

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="Debian's espeak-ng is not installed (.ci/run installs it): no real speech")


def spoken(text: str, rate: int) -> torch.Tensor:
    """`text` read by espeak-ng, (S,) float at `rate`."""
    out = subprocess.run(["espeak-ng", "--stdout", text], check=True, capture_output=True).stdout
    wave, sr = soundfile.read(io.BytesIO(out), dtype="float32")
    return resample(torch.from_numpy(np.ascontiguousarray(wave)), sr, rate)


def _audio() -> torch.Tensor:
    """Silence, speech, noise, speech, silence at 16 kHz, whole windows."""
    noise = 0.05 * torch.from_numpy(np.random.default_rng(0).standard_normal(16000).astype(np.float32))
    x = torch.cat([torch.zeros(8000), spoken("Hello there, how are you?", 16000), noise,
                   spoken("The weather in Paris is fine.", 16000), torch.zeros(16000)])
    return x[: x.shape[0] // WINDOW * WINDOW]


def _package_file(name: str) -> Path:
    found = importlib.util.find_spec("silero_vad")
    assert found is not None and found.submodule_search_locations, "silero-vad is a dependency (setup.cfg)"
    return Path(next(iter(found.submodule_search_locations))) / "data" / name


def _oracle(tensors: dict[str, torch.Tensor] | None = None) -> torch.jit.ScriptModule:
    model = torch.jit.load(str(_package_file("silero_vad.jit"))).eval()
    if tensors is not None:
        params = dict(model.named_parameters()) | dict(model.named_buffers())
        with torch.no_grad():
            for ours, theirs in _NAMES.items():
                params[theirs].copy_(tensors[ours])
    return model


# published safetensors name -> the package's TorchScript model's (16 kHz branch)
_NAMES = {"stft_conv.weight": "_model.stft.forward_basis_buffer",
          **{f"conv{i + 1}.{t}": f"_model.encoder.{i}.reparam_conv.{t}" for i in range(4) for t in ("weight", "bias")},
          **{f"lstm_cell.{t}": f"_model.decoder.rnn.{t}" for t in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")},
          **{f"final_conv.{t}": f"_model.decoder.decoder.2.{t}" for t in ("weight", "bias")}}


def _oracle_probs(model: torch.jit.ScriptModule, audio: torch.Tensor) -> torch.Tensor:
    model.reset_states()
    with torch.no_grad():
        return torch.stack([model(w[None], 16000)[0, 0] for w in audio.split(WINDOW)])


def _node_probs(module: torch.nn.Module, streams: list[torch.Tensor], per_chunk: int = 3) -> list[torch.Tensor]:
    """Our executor on several requests at once, their windows in chunks of `per_chunk` (state across Runs)."""
    ex = VadExecutor(module)
    for rid in range(len(streams)):
        ex.open(rid, RequestParams())
    windows = [list(s.split(WINDOW)) for s in streams]
    out: list[list[torch.Tensor]] = [[] for _ in streams]
    for start in range(0, max(len(w) for w in windows), per_chunk):
        live = [i for i, w in enumerate(windows) if start < len(w)]
        inputs = [{"pcm": [Chunk([{"value": x} for x in windows[i][start: start + per_chunk]], 0, 0, False)]}
                  for i in live]
        for i, res in zip(live, ex.run([WorkItem(i, walk="detect") for i in live], inputs)):
            out[i].append(res.outputs["speech"])
    return [torch.cat(o) for o in out]


@needs_espeak
def test_the_architecture_equals_the_package_model_window_by_window(tmp_path):
    oracle = _oracle()
    params = dict(oracle.named_parameters()) | dict(oracle.named_buffers())
    save_file({ours: params[theirs].detach().contiguous() for ours, theirs in _NAMES.items()},
              str(tmp_path / "jit.safetensors"))
    module = component_class("silero_vad")(DIMS, {"weights": str(tmp_path / "jit.safetensors")}).eval()
    audio = _audio()
    want = _oracle_probs(oracle, audio)
    got, = _node_probs(module, [audio])
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert (want > 0.5).any() and (want < 0.1).any(), "the audio holds both speech and silence"


@needs_espeak
def test_the_published_file_served_equals_the_package_model_on_it_batched():
    module = component_class("silero_vad")(DIMS, dict(SPEC.args)).eval()     # package:silero_vad/data/...
    oracle = _oracle(load_safetensors(_package_file("silero_vad_16k.safetensors")))
    audio = _audio()
    other = torch.cat([torch.zeros(4 * WINDOW), audio[: audio.shape[0] // 2]])    # a second request, shifted
    got, got_other = _node_probs(module, [audio, other])
    torch.testing.assert_close(got, _oracle_probs(oracle, audio), atol=ATOL, rtol=0)
    torch.testing.assert_close(got_other, _oracle_probs(oracle, other), atol=ATOL, rtol=0)
    speech = got > 0.5
    assert speech.any() and not speech[: 8000 // WINDOW].any(), "speech heard, the leading silence not"


def test_a_missing_package_file_names_the_reference_and_the_fix():
    with pytest.raises(FileNotFoundError, match=r"'package:silero_vad/data/nope\.safetensors'.*no such file"):
        component_class("silero_vad")(DIMS, {"weights": "package:silero_vad/data/nope.safetensors"})
    with pytest.raises(FileNotFoundError, match=r"no installed package 'no_such_pkg' \(pip install no-such-pkg\)"):
        component_class("silero_vad")(DIMS, {"weights": "package:no_such_pkg/w.safetensors"})
