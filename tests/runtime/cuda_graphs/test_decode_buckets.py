"""Batch buckets: the plan's capture regions name a node's buckets; a batch takes the smallest that holds it."""
from __future__ import annotations

from pathlib import Path

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.compiled import bucket_for, capture_buckets

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"


def test_bucket_for_picks_the_smallest_bucket_that_holds_the_batch() -> None:
    buckets = (1, 2, 4, 8, 12)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 4, 5, 9, 12)] == [1, 2, 4, 4, 8, 12, 12]
    assert bucket_for(13, buckets) is None, "above the largest bucket: eager"
    assert bucket_for(0, buckets) is None


def test_capture_buckets_come_from_the_plans_capture_regions() -> None:
    plan = compile_file(str(GRAPHS / "smollm2.yaml"), Options(preset="tiny")).plan
    max_batch = plan.node("lm").max_batch
    assert capture_buckets(plan, "lm", 0) == tuple(plan.capture_regions[0].batch_buckets)
    assert capture_buckets(plan, "lm", 0)[-1] == max_batch
    assert capture_buckets(plan, "lm", 1) == ()


def test_moe_thinker_has_no_capture_region() -> None:
    """Qwen3-MoE reads expert counts back to the host: its decode loop stays eager."""
    plan = compile_file(str(GRAPHS / "qwen3_omni.yaml"), Options(preset="tiny")).plan
    assert plan.node("thinker").kind == "qwen3_moe_lm" and not plan.node("thinker").is_capture_safe
    assert capture_buckets(plan, "thinker", 0) == ()
