"""kernels: SmolLM2-135M decode steps, mstar's CPU default against the CPU path before its fused kernels.

  mstar:    the GEMM `MSTAR_CPU_LINEAR=auto` picks (runtime.parallel.cpu_linear) and the fused CPU
            kernels of runtime/kernels/cpu.py between the GEMMs
  baseline: oneDNN GEMMs and torch's ops between them (MSTAR_CPU_LINEAR=onednn, MSTAR_CPU_KERNELS=torch),
            what a CPU rank ran before them
Both sides are the `lm` node of graphs/smollm2.yaml loaded in this process (suite_linear's `Decoder`);
the kernels' switch is one process-wide state, so each side's runs set it for their duration. One
measurement: greedy decode steps of a batch after a 32-token prefill, tokens/s; both sides are
checked to pick the same first tokens.
"""
from __future__ import annotations

from bench.registry import Context, Needs, register
from bench.results import Row
from bench.suite_chat import mstar_plan
from bench.suite_linear import BATCHES, PROMPT, QUICK_BATCHES, QUICK_STEPS, STEPS, Decoder, _row
from runtime.parallel.cpu_linear import gemm_kernel


KERNELS_MSTAR = "the {kernel} GEMM and the fused CPU kernels (mstar's CPU default here)"
KERNELS_BASELINE = "oneDNN GEMMs, torch ops between them (MSTAR_CPU_LINEAR=onednn MSTAR_CPU_KERNELS=torch)"


@register("kernels", "SmolLM2 decode steps: mstar's CPU default (its GEMM and fused kernels) vs oneDNN GEMMs + torch ops")
def run(ctx: Context) -> list[Row]:
    from runtime.kernels import cpu as cpu_kernels
    if cpu_kernels.status():
        raise Needs(f"the fused CPU kernels: {cpu_kernels.status()}")
    batches, steps = (QUICK_BATCHES, QUICK_STEPS) if ctx.quick else (BATCHES, STEPS)
    ctx.settings.update(batches=list(batches), steps=steps, prompt_tokens=PROMPT, gemm=gemm_kernel())
    plan = mstar_plan(ctx, "float32")
    sides = {"mstar": Decoder(plan), "baseline": Decoder(plan, linear="onednn", kernels=False)}
    labels = (KERNELS_MSTAR.format(kernel=gemm_kernel()), KERNELS_BASELINE)
    return [_row(ctx, "float32", sides, batch, steps, labels, "kernels") for batch in batches]
