"""Where a node's weights come from (`runtime.model_executor.weights.sources.resolve`): random only when asked for."""
from __future__ import annotations

from pathlib import Path

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.weights.sources import MissingWeights, WeightOptions, resolve, resolve_all

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"


def plan_of(graph: str, preset: str):
    return compile_file(str(GRAPHS / f"{graph}.yaml"), Options(preset=preset)).plan


def test_a_tiny_preset_is_random_by_declaration() -> None:
    plan = plan_of("orpheus", "tiny")
    assert plan.node("lm").random_weights
    assert resolve(plan, plan.node("lm"), WeightOptions()).describe() == "seed:0 (random weights)"


def test_a_full_size_preset_without_weights_is_an_error_naming_the_node() -> None:
    plan = plan_of("bagel", "bagel-7b")
    with pytest.raises(MissingWeights, match=r"node 'vit' \(siglip_vit, bagel.yaml:\d+:\d+\) reads its weights "
                                             r"from ByteDance-Seed/BAGEL-7B-MoT"):
        resolve(plan, plan.node("vit"), WeightOptions())


@pytest.mark.parametrize("graph,preset,nodes", [
    ("orpheus", "orpheus-3b", ["lm", "snac"]),
    ("bagel", "bagel-7b", ["vit", "vae_enc", "llm", "vae_dec"]),
    ("qwen3_omni", "qwen3-omni-30b-a3b", ["audio_enc", "vision_enc", "thinker", "talker", "code_predictor",
                                          "code2wav"]),
    ("vjepa2_ac", "vitg", ["encoder", "predictor"]),
])
def test_every_full_size_preset_with_an_empty_weights_dir_names_every_node(tmp_path: Path, graph: str, preset: str,
                                                                           nodes: list[str]) -> None:
    with pytest.raises(MissingWeights) as err:
        resolve_all(plan_of(graph, preset), WeightOptions((str(tmp_path),)))
    assert f"{len(nodes)} node(s) have no weights: {', '.join(nodes)}" in str(err.value)
    assert f"tried:\n    {tmp_path}/" in str(err.value)


def test_random_weights_on_request_and_none_for_nodes_without_parameters() -> None:
    plan = plan_of("bagel", "bagel-7b")
    assert resolve(plan, plan.node("vit"), WeightOptions(allow_random=True)).kind == "random"
    assert resolve(plan, plan.node("cfg"), WeightOptions()).kind == "none"


def test_root_holds_one_directory_per_repository_and_overrides_win(tmp_path: Path) -> None:
    plan = plan_of("orpheus", "orpheus-3b")
    (tmp_path / "root" / "orpheus-3b-0.1-ft").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    options = WeightOptions((str(tmp_path / "root"), f"snac_24khz={tmp_path / 'elsewhere'}"))
    assert resolve(plan, plan.node("lm"), options).path == str(tmp_path / "root" / "orpheus-3b-0.1-ft")
    assert resolve(plan, plan.node("snac"), options).path == str(tmp_path / "elsewhere")
    by_repo_id = WeightOptions((f"hubertsiuzdak/snac_24khz={tmp_path / 'elsewhere'}",))
    assert resolve(plan, plan.node("snac"), by_repo_id).path == str(tmp_path / "elsewhere")


def test_weights_given_but_not_found_are_an_error_even_for_a_random_preset(tmp_path: Path) -> None:
    """A user who points at weights never gets random ones instead (the tiny preset, mapped as published)."""
    from tests.runtime.serving.published_layouts import PRESET, published_preset
    graph = published_preset(tmp_path, "orpheus", "orpheus-3b", random_weights=True)
    plan = compile_file(str(graph), Options(preset=PRESET)).plan
    assert resolve(plan, plan.node("snac"), WeightOptions()).kind == "random"
    with pytest.raises(MissingWeights, match="snac_24khz .no such directory."):
        resolve(plan, plan.node("snac"), WeightOptions((str(tmp_path),)))


def test_weights_given_and_none_found_for_an_unmapped_node_of_a_random_preset_are_an_error(tmp_path: Path) -> None:
    """The same for a node with no published mapping (the tiny preset's): it used to start from random weights."""
    plan = plan_of("orpheus", "tiny")
    with pytest.raises(MissingWeights, match=rf"node 'lm' .*\n  tried:\n    {tmp_path}/lm \(not there\)"):
        resolve(plan, plan.node("lm"), WeightOptions((str(tmp_path),)))
    assert resolve(plan, plan.node("lm"), WeightOptions((str(tmp_path),), allow_random=True)).kind == "random"
    (tmp_path / "lm").mkdir()
    assert resolve(plan, plan.node("lm"), WeightOptions((str(tmp_path),))).path == str(tmp_path / "lm")


def test_a_cut_preset_reads_its_model_s_published_mapping() -> None:
    for graph, preset, node in (("qwen3_omni", "omni-wide", "thinker"), ("bagel", "bagel-wide", "llm")):
        with pytest.raises(MissingWeights, match="reads its weights from"):
            resolve(plan_of(graph, preset), plan_of(graph, preset).node(node), WeightOptions(("/nonexistent",)))


def test_worker_command_line_carries_the_options() -> None:
    options = WeightOptions(("/w", "snac_24khz=/s"), allow_random=True)
    assert options.cli_args() == ["--weights", "/w", "--weights", "snac_24khz=/s", "--random-weights"]
