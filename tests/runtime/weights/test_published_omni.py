"""A tiny Qwen3-Omni in the published layout (one repository: `thinker.`, `talker.` with
`talker.code_predictor.` inside, `code2wav.`; sharded safetensors + model.safetensors.index.json +
config.json) read by `check-weights` and the worker's loader through the seed graph's mappings;
every part loaded so (thinker, audio and vision encoders, talker, code predictor, code2wav) equals
transformers' Qwen3-Omni fed the same files, and config.json's shape-deciding values are checked
per part before loading."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from mstar_compiler.ir import Options
from mstar_compiler.catalogue.silero_vad import WEIGHTS as VAD_WEIGHTS
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.kv import KVBlockManager
from runtime.model_executor.weights import ConfigMismatch
from runtime.entrypoints.weights_cli import check_plan
from runtime.model_executor.weights.published import check_config
from runtime.model_executor.weights.sources import WeightOptions
from runtime.worker.loader import load_rank
from tests.runtime.models.qwen3_omni.omni_reference import close_to_largest, hf_model, omni_config, preset, randomize
from tests.runtime.serving.published_layouts import PRESET, published_preset, write_omni_repository

# one wrong shape-deciding value per part: (node, config.json key, the node's dim)
WRONG_PART_VALUES = [
    ("thinker", "thinker_config.text_config.num_attention_heads", "num_attention_heads"),
    ("audio_enc", "thinker_config.audio_config.encoder_attention_heads", "encoder_attention_heads"),
    ("vision_enc", "thinker_config.vision_config.spatial_merge_size", "spatial_merge_size"),
    ("talker", "talker_config.text_config.num_experts_per_tok", "num_experts_per_tok"),
    ("talker", "talker_config.accept_hidden_layer", "accept_hidden_layer"),
    ("code_predictor", "talker_config.code_predictor_config.num_key_value_heads", "num_key_value_heads"),
    ("code2wav", "code2wav_config.upsample_rates", "upsample_rates"),
]


@pytest.fixture(scope="module")
def omni(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("omni-published")
    plan = compile_file(str(published_preset(tmp, "qwen3_omni", "qwen3-omni-30b-a3b")), Options(preset=PRESET)).plan
    torch.manual_seed(0)
    reference = hf_model.Qwen3OmniMoeForConditionalGeneration(omni_config(preset("qwen3_moe_lm"))).eval()
    randomize(reference, seed=11)
    root = tmp / "weights"
    write_omni_repository(root / "Qwen3-Omni-30B-A3B-Instruct", reference)
    return plan, reference, root


def test_check_weights_reads_every_tensor_of_the_repository(omni) -> None:
    plan, _, root = omni
    out = io.StringIO()
    assert check_plan(plan, WeightOptions((str(root),)), out), out.getvalue()
    report = out.getvalue()
    for node in ("audio_enc", "vision_enc", "thinker", "talker", "code_predictor", "code2wav"):
        assert f"node {node} (" in report
    assert "missing 0, unexpected 0, wrong shape 0" in report and "read by no node" not in report


def test_a_config_with_another_vocabulary_fails_before_loading(omni, tmp_path: Path) -> None:
    plan, reference, _ = omni
    repo = tmp_path / "Qwen3-Omni-30B-A3B-Instruct"
    write_omni_repository(repo, reference)
    config = json.loads((repo / "config.json").read_text())
    config["thinker_config"]["text_config"]["vocab_size"] = 151936
    (repo / "config.json").write_text(json.dumps(config))
    out = io.StringIO()
    assert not check_plan(plan, WeightOptions((str(tmp_path),)), out)
    assert ("config.json `thinker_config.text_config.vocab_size` = 151936 but preset 'qwen3-omni-tiny' of node 'thinker' "
            "has vocab_size = 512") in out.getvalue()


@pytest.fixture(scope="module")
def loaded(omni) -> dict[str, torch.nn.Module]:
    """Rank 0's modules, loaded by the worker's loader from the repository through the graph's mappings."""
    plan, _, root = omni
    modules = load_rank(plan, 0, WeightOptions((str(root),)))
    sources = {name: source for name, (_, source) in modules.items()}
    assert sources.pop("vad") == VAD_WEIGHTS           # the voice activity detector's come with its wheel
    assert sources == {name: str(root / "Qwen3-Omni-30B-A3B-Instruct") for name in sources}
    return {name: module.eval() for name, (module, _) in modules.items()}


def test_thinker_logits_equal_transformers(omni, loaded) -> None:
    _, reference, _ = omni
    thinker = loaded["thinker"]
    ids = torch.tensor([5, 17, 200, 3, 99, 42, 7])
    manager, cache = KVBlockManager(8, 8), thinker.make_kv_cache(8, 8)
    manager.allocate(0, len(ids))
    with torch.no_grad():
        got = thinker.compute_logits(thinker(ids, torch.arange(len(ids)), manager.metadata([(0, len(ids))]), cache))
        want = reference.thinker(input_ids=ids[None]).logits[0]
    assert close_to_largest(got, want)


@torch.no_grad()
def test_encoders_and_code2wav_equal_transformers(omni, loaded) -> None:
    plan, reference, _ = omni
    audio, code2wav = loaded["audio_enc"], loaded["code2wav"]
    bins = plan.node("audio_enc").dims["num_mel_bins"]
    mels = [torch.randn(bins, n, generator=torch.Generator().manual_seed(n)) for n in (230, 60)]
    want = reference.thinker.model.audio_tower(input_features=torch.cat(mels, dim=1),
                                         feature_lens=torch.tensor([m.shape[1] for m in mels])).last_hidden_state
    assert close_to_largest(torch.cat(audio(mels)), want)
    d = plan.node("vision_enc").dims
    grids = torch.tensor([(1, 4, 4), (2, 4, 2)])            # an image and a two-frame video, packed
    patches = torch.randn(32, d["in_channels"] * d["temporal_patch_size"] * d["patch_size"] ** 2,
                          generator=torch.Generator().manual_seed(4))
    want_vision = reference.thinker.model.visual(hidden_states=patches, grid_thw=grids)
    hidden, deepstack = loaded["vision_enc"].encode_patches(patches, grids)
    assert close_to_largest(hidden, want_vision.pooler_output)
    assert all(close_to_largest(g, w) for g, w in zip(deepstack, want_vision.deepstack_features, strict=True))
    dims = plan.node("code2wav").dims
    codes = torch.randint(0, dims["codebook_size"], (1, dims["num_quantizers"], 12),
                          generator=torch.Generator().manual_seed(1))
    want = reference.code2wav(codes).squeeze(1)
    assert want.std() > 1e-3 and close_to_largest(code2wav(codes), want)


@pytest.mark.parametrize("node,key,dim", WRONG_PART_VALUES, ids=[f"{n}-{d}" for n, _, d in WRONG_PART_VALUES])
def test_a_wrong_config_value_names_the_part_the_field_and_both_values(omni, tmp_path: Path, node: str, key: str,
                                                                       dim: str) -> None:
    plan, _, root = omni
    config = json.loads((root / "Qwen3-Omni-30B-A3B-Instruct" / "config.json").read_text())
    *parents, field = key.split(".")
    section = config
    for part in parents:
        section = section[part]
    ours = plan.node(node).dims[dim]
    section[field] = wrong = [r + 1 for r in ours] if isinstance(ours, list) else ours + 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatch) as err:
        check_config(plan.node(node), tmp_path)
    assert f"node '{node}' (" in str(err.value)
    assert f"config.json `{key}` = {wrong!r} but preset '{plan.node(node).preset}' of node '{node}' has " \
           f"{dim} = {ours!r}" in str(err.value)


@torch.no_grad()
def test_code_predictor_frames_equal_transformers_generate(omni, loaded) -> None:
    plan, reference, _ = omni
    d = plan.node("code_predictor").dims
    groups = d["num_code_groups"]
    prefix = torch.randn(2, 2, d["hidden_size"], generator=torch.Generator().manual_seed(8))
    want = reference.talker.code_predictor.generate(inputs_embeds=prefix, max_new_tokens=groups - 1, do_sample=False,
                                                    output_logits=True, return_dict_in_generate=True)
    logits: list[torch.Tensor] = []
    codes, _ = loaded["code_predictor"].predict_frames(prefix, torch.tensor([5, 17]),
                                                       sample=lambda x: logits.append(x) or x.argmax(dim=-1))
    assert torch.equal(codes[:, 1:], want.sequences[:, -(groups - 1):])
    assert len(logits) == len(want.logits) == groups - 1
    assert all(close_to_largest(g, w) for g, w in zip(logits, want.logits))


@torch.no_grad()
def test_talker_logits_and_projections_equal_transformers(omni, loaded) -> None:
    plan, reference, _ = omni
    d, talker = plan.node("talker").dims, loaded["talker"]
    embeds = torch.randn(7, d["hidden_size"], generator=torch.Generator().manual_seed(4))
    manager, cache = KVBlockManager(8, 8), talker.make_kv_cache(8, 8)
    manager.allocate(0, len(embeds))
    got = talker.compute_logits(talker(embeds, torch.arange(len(embeds)), manager.metadata([(0, len(embeds))]), cache))
    assert close_to_largest(got, reference.talker(inputs_embeds=embeds[None], use_cache=False).logits[0])
    x = torch.randn(3, d["thinker_hidden_size"], generator=torch.Generator().manual_seed(6))
    assert close_to_largest(talker.project_text(x), reference.talker.text_projection(x))
    assert close_to_largest(talker.project_hidden(x), reference.talker.hidden_projection(x))
