"""A bf16 node is built without ever holding the whole model in fp32 (a 3B model's fp32 copy is 13 GB), and
its seeded weights are bit for bit those of the model built whole in fp32 and cast."""
from __future__ import annotations

import msgspec
import pytest
import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.components import component_class
from runtime.worker.loader import build_module, cast_as_built
from tests.runtime.serving.conftest import REPO

GRAPHS = ("smollm2", "orpheus", "bagel", "qwen3_omni", "vjepa2_ac")


def _bf16_nodes(graph: str) -> list:
    plan = compile_file(str(REPO / "graphs" / f"{graph}.yaml"), Options(preset="tiny")).plan
    return [msgspec.structs.replace(n, dtype="bf16") for n in plan.nodes if n.weight_key == n.name]


@pytest.mark.parametrize("graph", GRAPHS)
def test_seeded_weights_equal_those_of_the_whole_model_cast(graph: str) -> None:
    for node in _bf16_nodes(graph):
        torch.manual_seed(0)
        built = build_module(node, None).state_dict()
        torch.manual_seed(0)
        whole = component_class(node.kind)(node.dims, {**dict(node.args), "weights": None})
        cast = whole.to(torch.bfloat16).state_dict()
        assert built.keys() == cast.keys(), node.name
        differ = [k for k in cast if not torch.equal(built[k], cast[k])]
        assert not differ, f"{graph}/{node.name}: {differ[:5]}"


@pytest.mark.parametrize("graph", GRAPHS)
def test_only_the_root_s_own_tensors_are_still_fp32_when_it_is_built(graph: str) -> None:
    for node in _bf16_nodes(graph):
        with cast_as_built(torch.bfloat16):
            module = component_class(node.kind)(node.dims, {**dict(node.args), "weights": None})
        fp32 = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.dtype == torch.float32]
        assert all("." not in n for n in fp32), f"{graph}/{node.name}: {fp32[:5]}"
