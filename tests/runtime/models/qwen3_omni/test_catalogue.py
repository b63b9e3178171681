"""The qwen3_omni catalogue entries: full-size counts, presets that connect, checkpoint loading.

(Tiny-preset counts against the runtime modules are checked for every kind by
tests/runtime/models/test_registry_matches_catalogue.py.)
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mstar_compiler.catalogue import load_catalogue
from mstar_compiler.catalogue.qwen3_omni import FULL
from tests.runtime.models.qwen3_omni.omni_reference import (audio_config, checkpoint_tensors, code2wav_config, hf_model, predictor_config, preset,
                            talker_config, vision_config)
from runtime.model_executor.components import component_class
from runtime.model_executor.weights import WeightLoadError

CATALOGUE = load_catalogue()


def _full(kind: str) -> dict:
    return dict(CATALOGUE[kind].presets[FULL])


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_full_size_counts_equal_transformers_modules():
    """Built on the meta device: the published sizes cost no memory or time."""
    talker, predictor = _full("qwen3_omni_talker"), _full("qwen3_omni_code_predictor")
    with torch.device("meta"):
        t = hf_model.Qwen3OmniMoeTalkerForConditionalGeneration(talker_config(talker, predictor))
        built = {
            "qwen3_omni_talker": _count(t) - _count(t.code_predictor),
            "qwen3_omni_code_predictor": _count(t.code_predictor),
            "qwen3_omni_code2wav": _count(hf_model.Qwen3OmniMoeCode2Wav(code2wav_config(_full("qwen3_omni_code2wav")))),
            "qwen3_omni_audio_encoder": _count(hf_model.Qwen3OmniMoeAudioEncoder(
                audio_config(_full("qwen3_omni_audio_encoder")))),
            "qwen3_omni_vision_encoder": _count(hf_model.Qwen3OmniMoeVisionEncoder(
                vision_config(_full("qwen3_omni_vision_encoder")))),
        }
    for kind, count in built.items():
        assert CATALOGUE[kind].num_params(_full(kind)) == count, kind
    # the published checkpoint's speech side: talker 3.18B, predictor 142M, code2wav 216M
    assert built["qwen3_omni_talker"] == 3_183_026_176 and built["qwen3_omni_code2wav"] == 216_016_577


@pytest.mark.parametrize("name", ["tiny", FULL])
def test_presets_connect(name):
    """Connected ports agree: encoders and talker at the thinker's width, codebooks all the way down."""
    thinker = CATALOGUE["qwen3_moe_lm"].presets["tiny" if name == "tiny" else "qwen3-30b-a3b"]
    audio, vision = (CATALOGUE[k].presets[name] for k in ("qwen3_omni_audio_encoder", "qwen3_omni_vision_encoder"))
    talker, predictor, code2wav = (CATALOGUE[k].presets[name] for k in
                                   ("qwen3_omni_talker", "qwen3_omni_code_predictor", "qwen3_omni_code2wav"))
    width = thinker["hidden_size"]
    assert audio["output_dim"] == vision["out_hidden_size"] == talker["thinker_hidden_size"] == width
    assert predictor["hidden_size"] == talker["hidden_size"]
    assert talker["num_code_groups"] == predictor["num_code_groups"] == code2wav["num_quantizers"]
    assert talker["codebook_size"] == predictor["vocab_size"] == code2wav["codebook_size"]
    specials = [v for k, v in talker.items() if k.startswith("codec_") and k.endswith("id")]
    specials += list(talker["speaker_id"].values())
    assert all(talker["codebook_size"] <= i < talker["vocab_size"] for i in specials)


def test_loads_its_own_tensors_and_refuses_another_components(tmp_path):
    """A component reads names relative to itself; which of a whole-model checkpoint's tensors are
    its own is the graph's mapping (tests/runtime/weights/test_published_omni.py), never the component."""
    dims = preset("qwen3_omni_code_predictor")
    reference = hf_model.Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration(predictor_config(dims))
    tensors = {k: v.contiguous() for k, v in checkpoint_tensors(reference).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    ours = component_class("qwen3_omni_code_predictor")(dims, {"weights": str(tmp_path)})
    assert torch.equal(ours.lm_head[1].weight, reference.lm_head[1].weight)
    assert torch.equal(ours.model.codec_embedding[0].weight, reference.model.codec_embedding[0].weight)

    save_file({**tensors, "thinker.model.norm.weight": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightLoadError, match=r"unexpected \(1\): thinker\.model\.norm\.weight"):
        component_class("qwen3_omni_code_predictor")(dims, {"weights": str(tmp_path)})
    del tensors["lm_head.2.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightLoadError, match="lm_head.2.weight"):
        component_class("qwen3_omni_code_predictor")(dims, {"weights": str(tmp_path)})