"""The kernels suite's two sides run what their labels say: mstar's side the fused CPU kernels and the
GEMM `auto` picks, the baseline torch's ops between oneDNN GEMMs (the CPU path before the kernels)."""
from __future__ import annotations

import pytest

from bench.suite_linear import Decoder
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.parallel.cpu_linear import gemm_kernel, onednn_available
from tests.runtime.serving.conftest import compile_plan


def test_the_sides_run_the_kernels_and_gemms_they_name(tmp_path, monkeypatch) -> None:
    if not onednn_available():
        pytest.skip("oneDNN's packed linear is not available in this torch build")
    plan = compile_plan(tmp_path, "smollm2", preset="tiny")
    sides = {"mstar": Decoder(plan), "baseline": Decoder(plan, linear="onednn", kernels=False)}
    calls = {"n": 0}

    def counting(fused):
        def counted(*args, **kwargs):
            calls["n"] += 1
            return fused(*args, **kwargs)
        return counted
    # the fused kernels one by one, or all of a forward's in one call (runtime/model_executor/layers/cpu_stack.py)
    for name in ("add_rms_norm", "decoder_stack"):
        monkeypatch.setattr(cpu_kernels, name, counting(getattr(cpu_kernels, name)))
    seen = {}
    for name, side in sides.items():
        calls["n"] = 0
        tokens, tok_s = side.decode(2, 3)
        seen[name] = calls["n"]
        assert len(tokens) == 2 and all(len(t) == 3 for t in tokens) and tok_s > 0
    assert seen["mstar"] > 0 and seen["baseline"] == 0
    assert cpu_kernels.status() == ""                       # the baseline's runs left the switch as it was
    packed = {name: side.model.model.layers[0].self_attn.qkv_proj.packed for name, side in sides.items()}
    assert packed["baseline"].dim() == 2                    # oneDNN's layout keeps the weight's shape
    assert packed["mstar"].dim() == (3 if gemm_kernel() == "mstar" else 2)
