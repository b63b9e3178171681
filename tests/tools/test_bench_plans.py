"""The SmolLM2 plans the benches serve: `--cpu-compile` turns on the lm node's compiled decode steps
in a copy of the graph, and changes nothing else of the plan; without it the plan is the graph's own."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.registry import Context
from bench.peer_mstar import mstar_plan
from mstar_compiler.plan import load_plan

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_compile_sets_the_lm_nodes_arg_and_nothing_else(dtype: str) -> None:
    plans = {}
    for compiled in (False, True):
        ctx = Context(rounds=1, quick=True, root=REPO, cpu_compile=compiled)
        plans[compiled] = load_plan(str(mstar_plan(ctx, dtype)))
        assert ctx.settings["mstar_cpu_compile"] is compiled
    plain, compiled = plans[False], plans[True]
    assert plain.node("lm").args.get("cpu_compile") is False
    assert compiled.node("lm").args["cpu_compile"] is True
    assert {k: v for k, v in compiled.node("lm").args.items() if k != "cpu_compile"} == \
        {k: v for k, v in plain.node("lm").args.items() if k != "cpu_compile"}
    assert compiled.node("lm").dims == plain.node("lm").dims and compiled.node("lm").dtype == plain.node("lm").dtype
    assert compiled.capture_regions == plain.capture_regions and compiled.capture_regions
