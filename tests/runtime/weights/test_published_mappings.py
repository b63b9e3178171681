"""Every full-size preset against its published checkpoint, key by key, on the meta device.

Each node is built on the meta device and its graph mapping is run against the published tensor
names and shapes (tests/runtime/weights/published): every published tensor is consumed by one
node or excluded on purpose, every slot is filled, every shape equal. A renamed or dropped key
fails with the node and the key named.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.plan import Plan
from runtime.model_executor.weights import ConfigMismatch
from runtime.model_executor.weights.headers import TensorInfo
from runtime.model_executor.weights.match import MatchReport
from runtime.model_executor.weights.published import check_config
from runtime.model_executor.weights.slots import Slot
from bench.bagel_layout import write_bagel_configs
from tests.runtime.weights.published_layouts import BAGEL_LLM, BAGEL_VIT, infos, meta_report, meta_slots, repository

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"
QWEN_SHARDS = "model-000NN-of-00015.safetensors (see model.safetensors.index.json)"


@functools.lru_cache(maxsize=None)
def full_plan(graph: str, preset: str) -> Plan:
    return compile_file(str(GRAPHS / f"{graph}.yaml"), Options(preset=preset)).plan


@functools.lru_cache(maxsize=None)
def node_slots(graph: str, preset: str, node: str) -> dict[str, Slot]:
    return meta_slots(full_plan(graph, preset).node(node))


def report(graph: str, preset: str, node: str, tensors: dict[str, TensorInfo]) -> MatchReport:
    return meta_report(full_plan(graph, preset).node(node), tensors, node_slots(graph, preset, node))


def vjepa_pt(wrapper: str = "module.backbone.") -> dict[str, TensorInfo]:
    """The V-JEPA 2-AC .pt as `convert-weights` flattens it: {encoder, predictor} dicts of `wrapper`* keys
    (DistributedDataParallel's `module.`, the wrapper's `backbone.`; the lists are stored stripped)."""
    lists = repository("vjepa2-vitg")
    tensors = {f"{part}.{wrapper}{k}": v for part in ("encoder", "predictor")
               for k, v in lists[f"vjepa2-ac-vitg.pt: {part}"].items()}
    return infos(tensors, "vjepa2-ac-vitg.safetensors")


def published(name: str) -> dict[str, TensorInfo]:
    if name == "vjepa2-ac":
        return vjepa_pt()
    return {k: v for file, tensors in repository(name).items() for k, v in infos(tensors, file).items()}


# (graph, preset, published list, nodes reading it, the published tensors no node reads)
CASES = [
    ("orpheus", "orpheus-3b", "orpheus-3b-0.1-ft", ["lm"], None),
    ("orpheus", "orpheus-3b", "snac_24khz", ["snac"], r"encoder\."),       # the node decodes codes only
    ("bagel", "bagel-7b", "bagel-7b-mot", ["vit", "llm", "vae_enc", "vae_dec"], None),
    ("qwen3_omni", "qwen3-omni-30b-a3b", "qwen3-omni-30b-a3b-instruct",
     ["audio_enc", "vision_enc", "thinker", "talker", "code_predictor", "code2wav"], None),
    ("vjepa2_ac", "vitg", "vjepa2-ac", ["encoder", "predictor"], None),
]


@pytest.mark.parametrize("graph,preset,repo,nodes,unread", CASES, ids=[c[2] for c in CASES])
def test_every_published_tensor_fills_one_slot(graph: str, preset: str, repo: str, nodes: list[str],
                                               unread: str | None) -> None:
    tensors = published(repo)
    consumed: dict[str, str] = {}
    for name in nodes:
        result = report(graph, preset, name, tensors)
        assert result.is_ok, f"node {name}:\n{result.problems()}"
        assert result.matched > 0
        for key in result.read:
            assert key not in consumed, f"{key} is read by both {consumed[key]} and {name}"
            consumed[key] = name
    # one node's `exclude:` may name another node's tensors, so "excluded" is no excuse: only these stay unread
    left = set(tensors) - set(consumed)
    expected = {k for k in tensors if unread and re.match(unread, k)}
    assert left == expected, f"{len(left ^ expected)} published tensors unexpectedly (un)read, " \
                             f"e.g. {sorted(left ^ expected)[:5]}"


@pytest.mark.parametrize("wrapper", ["module.backbone.", "module.", ""])
def test_the_vjepa2_ac_pt_lists_are_consumed_exactly(wrapper: str) -> None:
    lists, tensors = repository("vjepa2-vitg"), vjepa_pt(wrapper)
    # the encoder's 40 blocks x (weight, bias) fused qkv fill transformers' query, key and value (the
    # mapping's `split:`); the predictor module keeps upstream's fused qkv
    for part, count, splits in (("encoder", 484, 80), ("predictor", 300, 0)):
        expected = {f"{part}.{wrapper}{k}" for k in lists[f"vjepa2-ac-vitg.pt: {part}"]}
        result = report("vjepa2_ac", "vitg", part, tensors)
        assert result.is_ok, result.problems()
        assert len(expected) == count and result.read == expected
        slots = node_slots("vjepa2_ac", "vitg", part)
        assert result.matched == len(slots) == count + 2 * splits
        assert sum(".qkv." in name for name in slots) == (0 if splits else 48)


def test_qwen3_omni_thinker_has_the_omni_vocabulary() -> None:
    thinker = full_plan("qwen3_omni", "qwen3-omni-30b-a3b").node("thinker")
    assert thinker.dims["vocab_size"] == repository("qwen3-omni-30b-a3b-instruct")[QWEN_SHARDS][
        "thinker.model.embed_tokens.weight"][0] == 152064


def test_talker_and_code_predictor_split_the_talker_scope() -> None:
    tensors = published("qwen3-omni-30b-a3b-instruct")
    talker = report("qwen3_omni", "qwen3-omni-30b-a3b", "talker", tensors)
    predictor = report("qwen3_omni", "qwen3-omni-30b-a3b", "code_predictor", tensors)
    scope = {k for k in tensors if k.startswith("talker.code_predictor.")}
    assert len(scope) == 86 and predictor.read == scope and not talker.read & scope


def test_a_renamed_key_fails_naming_node_and_key() -> None:
    tensors = published("orpheus-3b-0.1-ft")
    tensors["model.layers.3.mlp.gate.weight"] = tensors.pop("model.layers.3.mlp.gate_proj.weight")
    result = report("orpheus", "orpheus-3b", "lm", tensors)
    assert result.node == "lm"
    assert result.unexpected == ["model.layers.3.mlp.gate.weight"]
    assert result.missing == ["model.layers.3.mlp.gate_proj.weight"]


def test_a_dropped_key_fails_naming_it() -> None:
    tensors = published("bagel-7b-mot")
    del tensors["decoder.up.0.block.1.conv2.weight"]            # FLUX's highest-resolution up-block
    result = report("bagel", "bagel-7b", "vae_dec", tensors)
    assert result.missing == ["decoder.up_blocks.3.resnets.1.conv2.weight"] and not result.unexpected


def test_a_wrong_shape_fails_naming_it() -> None:
    tensors = published("qwen3-omni-30b-a3b-instruct")
    info = tensors["thinker.lm_head.weight"]
    tensors["thinker.lm_head.weight"] = TensorInfo(info.file, info.dtype, (151936, 2048), info.nbytes)
    result = report("qwen3_omni", "qwen3-omni-30b-a3b", "thinker", tensors)
    assert result.misshaped == ["thinker.lm_head.weight (151936, 2048) != expected (152064, 2048) for lm_head.weight"]


def test_bagel_presets_agree_with_the_published_configs(tmp_path: Path) -> None:
    write_bagel_configs(tmp_path, BAGEL_LLM, BAGEL_VIT)
    for node in ("llm", "vit"):
        check_config(full_plan("bagel", "bagel-7b").node(node), tmp_path)


@pytest.mark.parametrize("node,file,dim,wrong", [("llm", "llm_config.json", "num_key_value_heads", 8),
                                                 ("vit", "vit_config.json", "num_attention_heads", 12)])
def test_a_wrong_bagel_config_value_names_the_part_the_field_and_both_values(tmp_path: Path, node: str, file: str,
                                                                             dim: str, wrong: int) -> None:
    llm, vit = dict(BAGEL_LLM), dict(BAGEL_VIT)
    (llm if node == "llm" else vit)[dim] = wrong
    write_bagel_configs(tmp_path, llm, vit)
    plan_node = full_plan("bagel", "bagel-7b").node(node)
    with pytest.raises(ConfigMismatch) as err:
        check_config(plan_node, tmp_path)
    assert (f"{file} `{dim}` = {wrong} but preset 'bagel-7b' of node '{node}' has "
            f"{dim} = {plan_node.dims[dim]}") in str(err.value)


# presets that keep the published shapes with fewer layers (`layers:`): (graph, preset, published preset, list,
# node -> layers kept)
CUT = [
    ("qwen3_omni", "omni-wide", "qwen3-omni-30b-a3b", "qwen3-omni-30b-a3b-instruct", {"thinker": 4, "talker": 4}),
    ("bagel", "bagel-wide", "bagel-7b", "bagel-7b-mot", {"llm": 8}),
]


@pytest.mark.parametrize("graph,preset,full,repo,cut", CUT, ids=[c[1] for c in CUT])
def test_a_preset_cut_in_depth_has_the_published_shapes(graph: str, preset: str, full: str, repo: str,
                                                         cut: dict[str, int]) -> None:
    """Run through the published preset's mapping, the cut node fills every slot from a published tensor of
    the same shape; what it leaves are exactly the tensors of the layers it does not build."""
    tensors = published(repo)
    for name, kept in cut.items():
        node = full_plan(graph, preset).node(name)
        assert (node.declared_layers, node.published_layers) == (kept, full_plan(graph, full).node(name).dims[
            "num_hidden_layers"])
        result = meta_report(full_plan(graph, full).node(name), tensors, meta_slots(node))
        assert not result.missing and not result.misshaped, f"node {name}:\n{result.problems()}"
        found = [re.search(r"\.layers\.(\d+)\.", key) for key in result.unexpected]
        assert result.unexpected and all(found), [k for k, m in zip(result.unexpected, found) if not m][:5]
        assert {int(m.group(1)) for m in found} == set(range(kept, node.published_layers))
