"""V-JEPA 2-AC served from its published pickle through `mstar-run --weights ROOT`.

ROOT/vjepa2/vjepa2-ac-vitg.pt is a torch pickle as facebookresearch/vjepa2's training script saves
it ({"encoder", "predictor"} under DistributedDataParallel's `module.`, the encoder's q/k/v fused,
target_encoder and optimizer state beside them), converted once by `mstar-run convert-weights`; the
graph's mapping strips the prefixes, renames the upstream encoder to transformers' names, splits
q/k/v and excludes the training state (`check-weights` finds every tensor accounted for). The served
rollout equals V-JEPA 2-AC's native rollout run on transformers' VJEPA2Model encoder and the predictor
the file was written from; a renamed key stops start-up.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.plan import Plan
from runtime.models.vjepa2 import native_rollout
from runtime.entrypoints.weights_cli import check_plan, convert_dir
from runtime.model_executor.weights.published import WeightMismatch
from runtime.worker.loader import check_plan_sources
from runtime.model_executor.weights.sources import WeightOptions, resolve_all
from tests.runtime.models.vjepa2.vjepa2_reference import hf_encoder, make, randomize
from tests.runtime.serving.conftest import Server, http, serve
from tests.runtime.serving.published_layouts import PRESET, published_preset, upstream_encoder, write_vjepa2_ac_pickle
from tests.runtime.serving.speech.test_rollouts import body, clip, rollout

HORIZON = 2


@dataclass
class Served:
    """The server, what it was started from, and the modules the checkpoint was written from."""

    server: Server
    root: Path                  # --weights ROOT
    plan_path: Path
    plan: Plan
    encoder: torch.nn.Module    # transformers' VJEPA2Model
    predictor: torch.nn.Module


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
    assert convert_dir(root / "vjepa2", io.StringIO())       # the command's own function (its CLI: Orpheus' test)
    plan_path = tmp / "plan.bin"
    plan_path.write_bytes(compiled.data)
    for srv in serve(str(plan_path), "--weights", str(root)):
        yield Served(srv, root, plan_path, compiled.plan, encoder, predictor)


def test_check_weights_accounts_for_every_tensor_of_the_pickle(vjepa2: Served) -> None:
    out = io.StringIO()
    assert check_plan(vjepa2.plan, WeightOptions((str(vjepa2.root),)), out), out.getvalue()
    assert "read by no node" not in out.getvalue()


def test_models_name_the_converted_checkpoint(vjepa2: Served) -> None:
    card = http("GET", f"{vjepa2.server.url}/v1/models")[1]["data"][0]
    repo = str(vjepa2.root / "vjepa2")
    assert card["weights"] == {"encoder": repo, "predictor": repo}
    assert card["random_weights"] == []


@torch.inference_mode()
def test_served_rollout_equals_transformers_encoder_and_native_rollout(vjepa2: Served) -> None:
    video, actions, states = clip(3, horizon=HORIZON)
    got = rollout(vjepa2.server, body(video, actions, states))
    features = vjepa2.encoder.get_vision_features(video[None])                        # (1, C*P, E)
    frames = torch.nn.functional.layer_norm(features, features.shape[-1:])     # the graph's normalize_reps
    want = native_rollout(vjepa2.predictor, frames, states[None], actions[None], horizon=HORIZON)[0]
    assert got.shape == want.shape == (HORIZON, *want.shape[1:])
    # fp32 both sides; transformers' attention and the cached rollout sum in other orders
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_renamed_key_stops_start_up_naming_node_and_key(vjepa2: Served, tmp_path: Path) -> None:
    """What the server checks before any worker starts (headers only; a worker that cannot load would
    die and be restarted): the first offending key, the slot it leaves empty and the node."""
    tensors = load_file(str(vjepa2.root / "vjepa2" / "vjepa2-ac-vitg.safetensors"))
    tensors["predictor.module.action_encoder.kernel"] = tensors.pop("predictor.module.action_encoder.weight")
    (tmp_path / "vjepa2").mkdir()
    save_file(tensors, str(tmp_path / "vjepa2" / "vjepa2-ac-vitg.safetensors"))
    sources = resolve_all(vjepa2.plan, WeightOptions((str(tmp_path),)))
    with pytest.raises(WeightMismatch) as error:
        check_plan_sources(vjepa2.plan, sources)
    message = str(error.value)
    assert message.startswith("node 'predictor' (vjepa2_ac_predictor)")
    assert "predictor.module.action_encoder.kernel (mapped to action_encoder.kernel)" in message
    assert "missing (1): action_encoder.weight" in message
