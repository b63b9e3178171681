"""tools/profile_vllm.py's reading of a torch-profiler trace: self times inside engine steps, by category."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import profile_vllm  # noqa: E402


def _op(name: str, ts: float, dur: float, dims: list | None = None, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": {"Input Dims": dims or []}}


def test_ops_count_their_self_time_in_the_steps_that_hold_them() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 100, "dur": 100, "tid": 1},
        _op("aten::linear", 0, 30), _op("aten::addmm", 5, 20, [[16, 576], [576, 1536]]),   # linear: 10 + 20
        _op("aten::linear", 40, 20), _op("aten::mm", 41, 18, [[16, 576], [576, 49152]]),    # LM head: 2 + 18
        _op("_C::rms_norm", 70, 10), _op("_C_cpu::cpu_attention_with_kv_cache", 110, 40),
        _op("aten::argmax", 160, 5), _op("aten::add", 170, 5),
        _op("aten::mm", 300, 50),        # after the last step: not counted
        {"ph": "X", "cat": "user_annotation", "name": "## Call CompiledFxGraph x ##", "ts": 0, "dur": 90, "tid": 1},
    ]}
    got = profile_vllm.breakdown(trace)
    assert got["step"] == pytest.approx(0.1)                     # 2 steps of 100 µs: 0.1 ms per step, rounded
    per_step = {c: v * 1e3 * 2 for c, v in got.items()}         # back to µs over both steps
    want = {"linears": 10 + 20 + 2,                              # the LM head's outer linear: its own 2 µs
            "lm_head": 18, "rope_norms": 10, "attention": 40, "sampling": 5, "other ops": 5,
            "fused kernels": 90 - 60,                            # the graph's time no op inside it accounts for
            "outside ops": 200 - 110 - 30}
    # whole µs to ms per step and back: a few float64 roundings (1.1e-16 relative), inside approx's default rel 1e-6
    assert {c: per_step[c] for c in want} == pytest.approx(want)
