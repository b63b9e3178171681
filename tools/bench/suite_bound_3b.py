"""bound-3b: `bound`'s rows (tools/bench/suite_bound.py) for Orpheus-3B's LM at its published shapes (Llama-3.2-3B,
vocabulary 156,940; graphs/orpheus.yaml's orpheus-3b preset with seeded random weights, which stream and multiply
as the checkpoint's would), bf16, batch 1 and 16: the decode step against the weight-streaming bound and the
roofline at the size people deploy (issue 40). A step reads 6.2 GB of weights: a few steps per round.
"""
from __future__ import annotations

from bench.peer_mstar import compile_plan
from bench.registry import Context, register
from bench.results import Row
from bench.suite_bound import _rows, record_settings
from bench.suite_linear import Decoder


ORPHEUS_BATCHES, ORPHEUS_STEPS, ORPHEUS_QUICK_STEPS = (1, 16), 4, 2
ORPHEUS = ("mstar decode step (lm node of graphs/orpheus.yaml's orpheus-3b preset: Llama-3.2-3B shapes, vocabulary "
           "156,940, seeded random weights, worker loader, packed linears, the whole LM head)")


@register("bound-3b", "Orpheus-3B's LM (Llama-3.2-3B shapes, random weights, bf16) decode step at batch 1 and 16 "
                      "vs the roofline (issue 40's real size)")
def run_3b(ctx: Context) -> list[Row]:
    steps = record_settings(ctx, ORPHEUS_BATCHES, ORPHEUS_QUICK_STEPS if ctx.quick else ORPHEUS_STEPS)
    plan = compile_plan(ctx.root / "graphs/orpheus.yaml", ctx.root / "bench-results/plans/orpheus-3b.plan.bin",
                        "--preset", "orpheus-3b", "--device-memory", "12GiB")
    decoder = Decoder(plan, packed=True, random_weights=True)
    return [row for batch in ORPHEUS_BATCHES
            for row in _rows(ctx, "bfloat16", decoder, steps, batch, ORPHEUS, "Orpheus-3B ")]
