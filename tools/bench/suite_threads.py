"""threads: SmolLM2-135M decode at batch 16 under the worker's thread placement and others.

Each side is its own process (OpenMP reads its settings once, when torch loads) that
loads the `lm` node of graphs/smollm2.yaml as the linear suite's `Decoder` does and, on
each request from this process, runs `STEPS` greedy decode steps of 16 requests and
answers tokens/s. The sides alternate round by round on the same machine, so whatever
else runs there (other users' jobs: the load is in the run's header) weighs on each alike:
  mstar:    what a worker does: 2 threads (one per core) and, before torch loads,
            `runtime.worker.openmp.passive_waits` (idle OpenMP threads sleep at once);
  baseline: 2 threads with libgomp's default spin-waits (the worker before), or 1 thread.
Spinning threads are the ones a neighbour's load hurts: a descheduled spinner stalls every
parallel region of the step (runtime/worker/openmp.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import HIGHER
from bench.suite_chat import mstar_plan

BATCH, STEPS, QUICK_STEPS = 16, 16, 4
DEFAULT = "2 threads as a worker sets them (idle OpenMP threads sleep: runtime.worker.openmp)"
# name -> (OMP_NUM_THREADS, whether the child applies the worker's OpenMP settings)
PLACEMENTS = {"2 threads, libgomp's default spin-waits (the worker before)": ("2", False),
              "1 thread": ("1", True)}
CHILD = """
import os, sys
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tools")]
if sys.argv[3] == "worker":
    from runtime.worker.openmp import passive_waits
    passive_waits(os.environ)
from bench.suite_linear import Decoder
decoder = Decoder(sys.argv[2], packed=True)
decoder.decode({batch}, 2)
print("ready", flush=True)
for line in sys.stdin:
    print(decoder.decode({batch}, int(line))[1], flush=True)
"""


class Placement:
    """A decoding child process with its own OpenMP environment."""

    def __init__(self, ctx: Context, plan: Path, threads: str, as_worker: bool) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD.format(batch=BATCH), str(ctx.root),
                                      str(plan), "worker" if as_worker else "plain"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**base, "OMP_NUM_THREADS": threads})
        if self.proc.stdout.readline().strip() != "ready":
            raise Needs(f"a decoding child ({threads} threads) to start (it exited with {self.proc.wait()})")

    def tok_s(self, steps: int) -> dict[str, float]:
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        return {"tok_s": float(self.proc.stdout.readline())}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@register("threads", "SmolLM2 decode at batch 16: the worker's thread placement vs 1 thread / passive OpenMP waits")
def run(ctx: Context) -> list[Row]:
    steps = QUICK_STEPS if ctx.quick else STEPS
    ctx.settings.update(batch=BATCH, steps=steps, placements={"mstar": DEFAULT, **PLACEMENTS})
    plan = mstar_plan(ctx, "float32")
    sides = {"mstar": Placement(ctx, plan, "2", as_worker=True)}
    try:
        for name, (threads, as_worker) in PLACEMENTS.items():
            sides[name] = Placement(ctx, plan, threads, as_worker)
        samples = ctx.alternate("threads", {n: (lambda p=p: p.tok_s(steps)) for n, p in sides.items()}, warmup=0)
    finally:
        for side in sides.values():
            side.close()
    return [Row(f"fp32, batch {BATCH}, vs {name}", "decode throughput", "tok/s", HIGHER,
                Side(DEFAULT, samples["mstar"]["tok_s"]), Side(name, samples[name]["tok_s"]),
                plot="threads", x=name, xlabel="placement",
                note="the machine's load (other users) is in the run's header") for name in PLACEMENTS]
