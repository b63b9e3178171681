"""The runtime registry and the torch-free catalogue describe the same kinds.

The compiler plans memory from the catalogue's parameter counts; this test builds every
kind's runtime module from each small preset and compares exact parameter counts, so the
two cannot drift.
"""
from __future__ import annotations

import pytest

from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class, registered_kinds

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
