"""threads: SmolLM2-135M decode at batch 16 under the worker's thread placement and others,
on the machine as it is and beside one busy neighbour.

Each side is its own process (OpenMP reads its settings once, when torch loads) that
loads the `lm` node of graphs/smollm2.yaml as the linear suite's `Decoder` does and, on
each request from this process, runs `STEPS` greedy decode steps of 16 requests and
answers tokens/s (and the threads it ran at the end). The sides alternate round by round:
  mstar:    what a worker does (runtime/worker/openmp.py): 2 threads (one per core) that spin
            briefly before they sleep (`worker_waits`), and its `ThreadGovernor` between steps,
            which runs a thread fewer per core other processes keep busy;
  baseline: 2 threads that sleep at once (OMP_WAIT_POLICY=PASSIVE: the worker before), 2
            threads with libgomp's default spin-waits, or 1 thread.
Every comparison runs twice: as the machine is (other users' jobs: the load is in the
run's header), then with a neighbour this suite starts, one process spinning on one core
(`NEIGHBOUR`), as another tenant's job would. Long spinners are the ones a neighbour hurts (a
descheduled thread stalls every parallel region of the step); threads that sleep at once pay a
wake-up per region on any machine.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import HIGHER
from bench.peer_mstar import mstar_plan

BATCH, STEPS, QUICK_STEPS = 16, 48, 4   # 48 steps: ~1.5 s, the governor's windows (0.5 s) fit twice
DEFAULT = ("2 threads as a worker runs them (brief spins; a thread fewer per core others keep busy: "
           "runtime.worker.openmp)")
# name -> (OMP_NUM_THREADS, whether the child runs as a worker does, more environment)
PLACEMENTS = {"2 threads sleeping at once (OMP_WAIT_POLICY=PASSIVE, the worker before)":
                  ("2", False, {"OMP_WAIT_POLICY": "PASSIVE"}),
              "2 threads, libgomp's default spin-waits": ("2", False, {}),
              "1 thread": ("1", True, {})}
NEIGHBOUR = "while True: pass"     # another tenant's job: one core kept busy
CHILD = """
import os, sys
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tools")]
if sys.argv[3] == "worker":
    from runtime.worker.openmp import worker_waits
    worker_waits(os.environ)
import torch
from bench.suite_linear import Decoder
decoder = Decoder(sys.argv[2], packed=True)
if sys.argv[3] == "worker":
    from runtime.worker.openmp import ThreadGovernor
    decoder.after_step = ThreadGovernor(torch.get_num_threads(), torch.set_num_threads).after_batch
decoder.decode({batch}, 2)
print("ready", flush=True)
for line in sys.stdin:
    print(decoder.decode({batch}, int(line))[1], torch.get_num_threads(), flush=True)
"""


class Placement:
    """A decoding child process with its own OpenMP environment."""

    def __init__(self, ctx: Context, plan: Path, threads: str, as_worker: bool, env: dict[str, str]) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))} | env
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD.format(batch=BATCH), str(ctx.root),
                                      str(plan), "worker" if as_worker else "plain"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**base, "OMP_NUM_THREADS": threads})
        if self.proc.stdout.readline().strip() != "ready":
            raise Needs(f"a decoding child ({threads} threads) to start (it exited with {self.proc.wait()})")

    def tok_s(self, steps: int) -> dict[str, float]:
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        tok_s, threads = self.proc.stdout.readline().split()
        return {"tok_s": float(tok_s), "threads": float(threads)}

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@register("threads", "SmolLM2 decode at batch 16: the worker's thread placement vs spinning / 1 thread, "
                     "idle and beside a busy neighbour")
def run(ctx: Context) -> list[Row]:
    steps = QUICK_STEPS if ctx.quick else STEPS
    ctx.settings.update(batch=BATCH, steps=steps, neighbour=NEIGHBOUR,
                        placements={"mstar": DEFAULT, **{n: p[2] for n, p in PLACEMENTS.items()}})
    plan = mstar_plan(ctx, "float32")
    sides = {"mstar": Placement(ctx, plan, "2", True, {})}
    try:
        for name, (threads, as_worker, env) in PLACEMENTS.items():
            sides[name] = Placement(ctx, plan, threads, as_worker, env)
        measures = {n: (lambda p=p: p.tok_s(steps)) for n, p in sides.items()}
        cases = {"as the machine is": ctx.alternate("threads", measures, warmup=0)}
        with _neighbour():
            cases["beside one busy neighbour"] = ctx.alternate("threads, neighbour", measures, warmup=0)
    finally:
        for side in sides.values():
            side.close()
    return [Row(f"fp32, batch {BATCH}, {case}, vs {name}", "decode throughput", "tok/s", HIGHER,
                Side(DEFAULT, samples["mstar"]["tok_s"]), Side(name, samples[name]["tok_s"]),
                plot="threads" if case == "as the machine is" else "threads-neighbour", x=name,
                xlabel="placement", note=f"{case}; the worker's side ran {_threads(samples['mstar'])} threads at the "
                                         f"end of its runs; the machine's load (other users) is in the run's header")
            for case, samples in cases.items() for name in PLACEMENTS]


def _threads(samples: dict[str, list[float]]) -> str:
    return "/".join(str(int(t)) for t in samples["threads"])


@contextlib.contextmanager
def _neighbour() -> Iterator[None]:
    """One process keeping one core busy while the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()
