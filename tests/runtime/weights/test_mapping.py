"""The mapping rules one by one (`runtime.model_executor.weights.mapping`), and the compiler's checks of them."""
from __future__ import annotations

import pytest
import torch

from mstar_compiler.errors import CompileError
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file, compile_text
from mstar_compiler.plan import IndexRemap, Rename, Split, WeightMap
from runtime.model_executor.weights.mapping import CompiledMap, Target
from tests.runtime.serving.conftest import REPO

FLUX = WeightMap(source="o/ae", prefix="", exclude=["^encoder\\."],
                 index_remap=[IndexRemap("^decoder\\.up\\.(\\d+)\\.", 4)],
                 rename=[Rename("\\.up\\.(\\d+)\\.block\\.(\\d+)\\.", ".up_blocks.\\1.resnets.\\2.")],
                 reshape=[".*\\.to_q\\.weight"])


def test_prefix_exclude_index_remap_rename() -> None:
    cmap = CompiledMap(FLUX)
    assert cmap.targets("encoder.conv_in.weight") is None
    assert cmap.is_excluded("encoder.conv_in.weight")
    assert cmap.targets("decoder.up.0.block.2.conv1.weight") == [Target("decoder.up_blocks.3.resnets.2.conv1.weight")]
    assert cmap.targets("decoder.up.3.block.0.conv1.weight") == [Target("decoder.up_blocks.0.resnets.0.conv1.weight")]
    scoped = CompiledMap(WeightMap(source="o/r", prefix="talker.", exclude=["^code_predictor\\."]))
    assert scoped.targets("talker.model.norm.weight") == [Target("model.norm.weight")]
    assert scoped.targets("talker.code_predictor.model.norm.weight") is None
    assert scoped.targets("thinker.model.norm.weight") is None and not scoped.is_excluded("thinker.x")


def test_reshape_only_where_declared_and_with_equal_element_count() -> None:
    cmap = CompiledMap(FLUX)
    assert cmap.fits("a.to_q.weight", (8, 8, 1, 1), (8, 8))
    assert not cmap.fits("a.to_k.weight", (8, 8, 1, 1), (8, 8))
    assert not cmap.fits("a.to_q.weight", (8, 4, 1, 1), (8, 8))
    tensor = torch.arange(64.0).reshape(8, 8, 1, 1)
    assert torch.equal(cmap.tensor(Target("a.to_q.weight"), tensor, (8, 8)), tensor[:, :, 0, 0])


def test_split_of_a_fused_tensor() -> None:
    cmap = CompiledMap(WeightMap(source="o/r", split=[Split("(.*)\\.qkv\\.(weight|bias)",
                                                           ["\\1.query.\\2", "\\1.key.\\2", "\\1.value.\\2"])]))
    targets = cmap.targets("layer.3.qkv.weight")
    assert [t.name for t in targets] == ["layer.3.query.weight", "layer.3.key.weight", "layer.3.value.weight"]
    fused = torch.arange(24.0).reshape(6, 4)
    assert cmap.target_shape(targets[1], (6, 4)) == (2, 4)
    assert torch.equal(cmap.tensor(targets[1], fused, (2, 4)), fused[2:4])


GRAPH = """
mstar: 1
model: m
presets:
  p:
    weights:
      lm: {source: o/r, %s}
nodes:
  lm: {kind: llama_lm}
walks:
  w: [lm]
tasks:
  t: [w]
"""


@pytest.mark.parametrize("rule,message", [
    ("rename: [{match: '(', to: x}]", "bad regular expression '\\('"),
    ("index_remap: [{match: 'up\\.\\d+', count: 4}]", "index_remap needs a group"),
    ("config: {vocab_size: vocab}", "unknown dim 'vocab' of node 'lm'"),
    ("split: [{match: 'a', into: [x, x]}]", "split names repeat"),
    ("renames: []", "renames"),
    ("config_file: llm_config.yaml", "config_file"),
])
def test_the_compiler_checks_every_rule(rule: str, message: str) -> None:
    with pytest.raises(CompileError, match=message):
        compile_text(GRAPH % rule, "g.yaml", Options(preset="p"))


def test_the_plan_carries_the_mapping() -> None:
    plan = compile_text(GRAPH % "prefix: 'm.', exclude: ['^x']", "g.yaml", Options(preset="p")).plan
    node = plan.node("lm")
    assert node.weight_map == WeightMap(source="o/r", prefix="m.", exclude=["^x"])
    assert not node.random_weights and node.weights is None
    other = compile_text(GRAPH % "config_file: llm_config.json, config: {vocab_size: vocab_size}", "g.yaml",
                         Options(preset="p")).plan.node("lm").weight_map
    assert other.config_file == "llm_config.json" and other.config == {"vocab_size": "vocab_size"}


@pytest.mark.parametrize("wrapper", ["module.backbone.", "module.", "backbone.", ""])
def test_vjepa2_ac_names_with_or_without_the_training_wrappers(wrapper: str) -> None:
    """The .pt's state dicts may carry DistributedDataParallel's `module.` and the multi-sequence
    wrapper's `backbone.`; upstream's hub loader strips either, and so does the graph's mapping."""
    plan = compile_file(str(REPO / "graphs" / "vjepa2_ac.yaml"), Options(preset="vitg")).plan
    encoder, predictor = (CompiledMap(plan.node(n).weight_map) for n in ("encoder", "predictor"))
    assert encoder.targets(f"encoder.{wrapper}blocks.3.mlp.fc1.weight") == [Target("encoder.layer.3.mlp.fc1.weight")]
    assert predictor.targets(f"predictor.{wrapper}predictor_blocks.0.attn.qkv.bias") == [
        Target("predictor_blocks.0.attn.qkv.bias")]
    assert predictor.targets(f"encoder.{wrapper}norm.weight") is None
    for training_state in (f"target_encoder.{wrapper}norm.weight", "opt.state.0.exp_avg"):
        assert encoder.targets(training_state) is None and predictor.is_excluded(training_state)
