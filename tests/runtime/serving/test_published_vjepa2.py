"""V-JEPA 2-AC served from its published pickle through `mstar-run --weights ROOT`.

ROOT/vjepa2/vjepa2-ac-vitg.pt is a torch pickle as facebookresearch/vjepa2 saves it
({"encoder", "predictor"} under `module.backbone.`, the encoder's q/k/v fused), converted once by
`mstar-run convert-weights`; the graph's mapping strips the prefixes, renames the upstream encoder
to transformers' names and splits q/k/v. The served rollout equals V-JEPA 2-AC's native rollout run
on transformers' VJEPA2Model encoder and the predictor the file was written from.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.models.vjepa2 import native_rollout
from tests.runtime.models.vjepa2.vjepa2_reference import hf_encoder, make, randomize
from tests.runtime.serving.conftest import REPO, http, serve
from tests.runtime.serving.published_layouts import PRESET, published_preset, upstream_encoder, write_vjepa2_ac_pickle
from tests.runtime.serving.speech.test_rollouts import body, clip, rollout

HORIZON = 2


@pytest.fixture(scope="module")
def vjepa2(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("vjepa2-published")
    graph = published_preset(tmp, "vjepa2_ac", "vitg")
    compiled = compile_file(str(graph), Options(preset=PRESET))
    torch.manual_seed(1)
    encoder = randomize(hf_encoder(compiled.plan.node("encoder").dims), seed=5)
    predictor = randomize(make("vjepa2_ac_predictor", seed=2), seed=6)
    root = tmp / "weights"
    write_vjepa2_ac_pickle(root / "vjepa2", upstream_encoder(encoder.state_dict()), predictor.state_dict())
    converted = subprocess.run([sys.executable, "-m", "runtime.cli", "convert-weights", str(root / "vjepa2")],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
    assert converted.returncode == 0, converted.stderr
    plan_path = tmp / "plan.bin"
    plan_path.write_bytes(compiled.data)
    for srv in serve(str(plan_path), "--weights", str(root)):
        yield srv, root, encoder, predictor


def test_models_name_the_converted_checkpoint(vjepa2) -> None:
    srv, root, *_ = vjepa2
    card = http("GET", f"{srv.url}/v1/models")[1]["data"][0]
    assert card["weights"] == {"encoder": str(root / "vjepa2"), "predictor": str(root / "vjepa2")}
    assert card["random_weights"] == []


@torch.inference_mode()
def test_served_rollout_equals_transformers_encoder_and_native_rollout(vjepa2) -> None:
    srv, _, encoder, predictor = vjepa2
    video, actions, states = clip(3, horizon=HORIZON)
    got = rollout(srv, body(video, actions, states))
    features = encoder.get_vision_features(video[None])                        # (1, C*P, E)
    frames = torch.nn.functional.layer_norm(features, features.shape[-1:])     # the graph's normalize_reps
    want = native_rollout(predictor, frames, states[None], actions[None], horizon=HORIZON)[0]
    assert got.shape == want.shape == (HORIZON, *want.shape[1:])
    # fp32 both sides; transformers' attention and the cached rollout sum in other orders
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
