"""tools/profile_decode.py on the tiny smollm2 preset: every category is timed, none twice."""
from __future__ import annotations

from pathlib import Path

import profile_decode

ROOT = Path(__file__).resolve().parents[2]


def test_categories_are_timed_once_and_add_up_to_the_step() -> None:
    ex = profile_decode.load_executor(ROOT / "graphs/smollm2.yaml", "tiny")
    profile_decode.instrument(ex)
    rows = {b: profile_decode.profile_steps(ex, b, context=8, steps=1) for b in (1, 3)}
    for got in rows.values():
        assert all(got[c] > 0 for c in ("linears", "lm_head", "attention", "rope_norms", "sampling"))
        timed = sum(got[c] for c in profile_decode.CATEGORIES if c != "other")
        assert timed <= got["step"], "a category was counted twice (nested ranges)"
        # "other" is the step less the timed sum: added back, a rounding or two of 1.1e-16 relative; measured exact
        assert abs(timed + got["other"] - got["step"]) < 1e-6 * got["step"]
    text = profile_decode.table(rows)
    assert text.splitlines()[0] == "| category | batch 1 | batch 3 |"
    assert [line.split(" |")[0] for line in text.splitlines()[2:]] == [
        f"| {c}" for c in (*profile_decode.CATEGORIES, "step", "tok/s")]
    assert ex.pool.used_blocks == 0 == ex.executor.kv_used_blocks(), "the profiled requests' KV blocks were not freed"


def test_a_wrapped_mixture_of_experts_lm_is_timed_once() -> None:
    """Qwen3-Omni's thinker: its executor's wrapper computes the logits through the head module (timed once, not
    in both ranges) and the sparse MLP is its own category."""
    ex = profile_decode.load_executor(ROOT / "graphs/qwen3_omni.yaml", "tiny")
    assert ex.executor.model is not profile_decode._lm(ex), "the thinker's executor no longer wraps its LM"
    profile_decode.instrument(ex)
    got = profile_decode.profile_steps(ex, 2, context=8, steps=1)
    assert all(got[c] > 0 for c in ("moe", "lm_head", "attention", "linears"))
    assert sum(got[c] for c in profile_decode.CATEGORIES if c != "other") <= got["step"], "a category counted twice"


def test_a_chunked_prefill_is_profiled_chunk_by_chunk_and_frees_its_blocks() -> None:
    ex = profile_decode.load_executor(ROOT / "graphs/smollm2.yaml", "tiny")
    profile_decode.instrument(ex)
    rows = {n: profile_decode.profile_prefill(ex, n, chunk=16) for n in (40, 64)}
    for got in rows.values():
        assert all(got[c] > 0 for c in ("linears", "attention", "rope_norms"))
        assert sum(got[c] for c in profile_decode.CATEGORIES if c != "other") <= got["step"]
    assert profile_decode.table(rows, "tokens").splitlines()[0] == "| category | tokens 40 | tokens 64 |"
    assert ex.pool.used_blocks == 0 == ex.executor.kv_used_blocks()


def test_the_unprofiled_steps_time_both_paths_of_a_model_the_stack_takes() -> None:
    ex = profile_decode.load_executor(ROOT / "graphs/smollm2.yaml", "tiny")
    got = profile_decode.stack_vs_per_layer(ex, batch=2, context=8, steps=1, rounds=1)
    assert set(got) == {"stack", "per-layer"} and all(ms > 0 for ms in got.values())
    assert ex.executor.model.cpu_stack is None, "the choice is left to the next forward"
    assert ex.pool.used_blocks == 0 == ex.executor.kv_used_blocks()
