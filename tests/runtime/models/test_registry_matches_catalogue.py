"""The runtime and the torch-free catalogue describe the same kinds and families.

The compiler plans memory from the catalogue's parameter counts; this test builds every
kind's runtime module from each small preset and compares exact parameter counts, so the
two cannot drift. Every executor and serving a family declares imports, and a node that
names an executor no family declares is told which ones exist.
"""
from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
import torch

from mstar_compiler.catalogue import load_catalogue, load_families, load_ref
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.entrypoints.http.families import FamilyServing
from runtime.model_executor.components import component_class, registered_kinds
from runtime.worker.executors import executor_for

CATALOGUE = load_catalogue()
# presets small enough to build on a CPU in a test (the full-size ones are checked by formula only)
SMALL = [(spec.kind, name) for spec in CATALOGUE.specs() for name in spec.presets
         if name in ("tiny", "bench-mid") or name.endswith("-tiny")]


def test_every_catalogue_kind_has_an_implementation():
    assert CATALOGUE.kinds(), "the catalogue is empty"
    missing = sorted(set(CATALOGUE.kinds()) - set(registered_kinds()))
    assert not missing, f"catalogue kinds without a runtime implementation: {missing}"


@pytest.mark.parametrize("kind, preset", SMALL, ids=[f"{k}:{p}" for k, p in SMALL])
def test_parameter_count_matches_catalogue(kind, preset):
    spec = CATALOGUE[kind]
    dims = spec.presets[preset]
    module = component_class(kind)(dims, dict(spec.args))
    assert module.kind == kind
    assert sum(p.numel() for p in module.parameters()) == spec.num_params(dims)


def test_every_declared_executor_and_serving_imports():
    for family in load_families().values():
        for name, ref in family.executors.items():
            assert callable(load_ref(ref)), f"family {family.name}: executor {name} = {ref} is not callable"
        if family.serving:
            assert isinstance(load_ref(family.serving), FamilyServing), f"family {family.name}: {family.serving}"


def test_an_unknown_executor_names_the_node_its_source_and_the_known_ones():
    graph = Path(__file__).resolve().parents[3] / "graphs" / "smollm2.yaml"
    plan = compile_file(str(graph), Options(preset="tiny")).plan
    node = msgspec.structs.replace(plan.nodes[0], executor="no_such_executor")
    named = re.escape(f"node '{node.name}' ({node.source}) names executor 'no_such_executor'")
    with pytest.raises(KeyError, match=named + r".*mstar\.families.*known: .*decoder_lm.*stateless"):
        executor_for(node, torch.nn.Module(), 0, plan)
