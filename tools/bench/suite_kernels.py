"""kernels: SmolLM2-135M decode steps, mstar's CPU default against the CPU path before its fused kernels.

  mstar:    the GEMM `MSTAR_CPU_LINEAR=auto` picks (runtime.model_executor.parallel.cpu_linear) and the fused CPU
            kernels of runtime/model_executor/kernels/cpu.py between the GEMMs
  baseline: oneDNN GEMMs and torch's ops between them (MSTAR_CPU_LINEAR=onednn, MSTAR_CPU_KERNELS=torch),
            what a CPU rank ran before them
Both sides are the `lm` node of graphs/smollm2.yaml loaded in this process (suite_linear's `Decoder`);
the kernels' switch is one process-wide state, so each side's runs set it for their duration. One
measurement: greedy decode steps of a batch after a 32-token prefill, tokens/s; both sides are
checked to pick the same first tokens. Prefill rows: one request's prompt of 256 / 1,024 tokens
fed in chunks of 256 (the server's --prefill-chunk-tokens), seconds to its first token.

GEMM rows (fp32 and bf16, the decode batches and 8): the panel GEMM against oneDNN's packed GEMM, both with the
fused kernels between them (MSTAR_CPU_LINEAR=mstar vs onednn) and both layer by layer from Python: the panel
side's layer stack in one C++ call (runtime/model_executor/layers/cpu_stack.py) is switched off, since oneDNN-packed layers cannot
take it, so the rows compare the GEMMs and nothing else. What `auto`'s choice rests on (bf16 on AMX CPUs:
oneDNN; runtime.model_executor.parallel.cpu_linear), batch 8 where the two cross there. bf16 rows
are left out where oneDNN has no bf16 kernels for the CPU (said among the results' needs).
"""
from __future__ import annotations

from bench.registry import Context, Needs, register
import time

from bench.results import Row, Side
from bench.stats import LOWER
from bench.peer_mstar import mstar_plan
from bench.suite_linear import BATCHES, PROMPT, QUICK_BATCHES, QUICK_STEPS, STEPS, Decoder, _row
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

PREFILLS, QUICK_PREFILLS, CHUNK = (256, 1024), (256,), 256
from runtime.model_executor.parallel.cpu_linear import bf16_packable, gemm_kernel


KERNELS_MSTAR = "the {kernel} GEMM and the fused CPU kernels (mstar's CPU default here)"
KERNELS_BASELINE = "oneDNN GEMMs, torch ops between them (MSTAR_CPU_LINEAR=onednn MSTAR_CPU_KERNELS=torch)"
GEMM_MSTAR = "the panel GEMM (MSTAR_CPU_LINEAR=mstar), fused kernels between, layer by layer (no layer stack)"
GEMM_BASELINE = "oneDNN's packed GEMM (MSTAR_CPU_LINEAR=onednn), fused kernels between, layer by layer"


@register("kernels", "SmolLM2 decode steps: mstar's CPU default (its GEMM and fused kernels) vs oneDNN GEMMs + torch ops")
def run(ctx: Context) -> list[Row]:
    from runtime.model_executor.kernels import cpu as cpu_kernels
    if cpu_kernels.status():
        raise Needs(f"the fused CPU kernels: {cpu_kernels.status()}")
    batches, steps = (QUICK_BATCHES, QUICK_STEPS) if ctx.quick else (BATCHES, STEPS)
    ctx.settings.update(batches=list(batches), steps=steps, prompt_tokens=PROMPT, gemm=gemm_kernel())
    plan = mstar_plan(ctx, "float32")
    sides = {"mstar": Decoder(plan), "baseline": Decoder(plan, linear="onednn", kernels=False)}
    labels = (KERNELS_MSTAR.format(kernel=gemm_kernel()), KERNELS_BASELINE)
    rows = [_row(ctx, "float32", sides, batch, steps, labels, "kernels") for batch in batches]
    for tokens in QUICK_PREFILLS if ctx.quick else PREFILLS:
        samples = ctx.alternate(f"kernels prefill {tokens}", {
            name: (lambda d=d: {"s": _prefill(d, tokens)}) for name, d in sides.items()})
        rows.append(Row(f"float32, prefill {tokens} tokens", "time to the first token", "s", LOWER,
                        Side(labels[0], samples["mstar"]["s"]), Side(labels[1], samples["baseline"]["s"]),
                        note=f"one request, chunks of {CHUNK}"))
    del sides
    for dtype in ("float32", "bfloat16"):
        if dtype == "bfloat16" and not bf16_packable():
            ctx.record_needs("kernels gemm bfloat16", Needs("oneDNN's bf16 kernels, which this CPU lacks (AVX-512 "
                                                          "BW/VL/DQ, AVX-NE-CONVERT or AMX)"))
            continue
        plan = mstar_plan(ctx, dtype)
        gemms = {"mstar": Decoder(plan, linear="mstar"), "baseline": Decoder(plan, linear="onednn")}
        gemms["mstar"].model.cpu_stack = False     # oneDNN's side runs layer by layer: so does this one
        rows.extend(_row(ctx, dtype, gemms, batch, steps, (GEMM_MSTAR, GEMM_BASELINE), "kernels gemm",
                         "GEMMs panel vs oneDNN, ")
                    for batch in sorted({*batches, 8}))
        del gemms
    return rows


def _prefill(side: Decoder, tokens: int) -> float:
    """Seconds to prefill one request's `tokens`-token prompt in chunks of CHUNK (its first token sampled)."""
    ex, ids = side.executor, [(i * 31) % 4000 + 10 for i in range(tokens)]
    ex.open(0, RequestParams(sampling=SamplingParams(temperature=0.0)))
    try:
        with side.running():
            start = time.perf_counter()
            for a in range(0, tokens, CHUNK):
                ex.run([side.WorkItem(0, tokens=ids[a:a + CHUNK], partial=a + CHUNK < tokens)], [{}])
            return time.perf_counter() - start
    finally:
        ex.close(0, kv_only=False)
