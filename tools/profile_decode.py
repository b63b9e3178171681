"""Per-op profile of one decode step of a plan's LM node, at several batch sizes (torch.profiler).

    python tools/profile_decode.py                               # SmolLM2-135M (graphs/smollm2.yaml), batch 1/16/64
    python tools/profile_decode.py --preset tiny --batches 1,4   # the tiny random model (a smoke run)
    python tools/profile_decode.py --threads 1 --steps 10 --context 128
    python tools/profile_decode.py --prefill 1024,8192 --chunk 256    # one chunked prefill per length
    python tools/profile_decode.py --graph graphs/orpheus.yaml --preset orpheus-3b --random-weights \
        --device-memory 8GiB --batches 1,16                      # a real-size preset (its KV pool sized down)

The LM node runs in this process through the executor a worker uses (no HTTP, no
conductor, no ZeroMQ): `--batch` requests are prefilled with `--context` random tokens,
then `--steps` decode steps are profiled, each inside `record_function` ranges placed on
the model's modules: linears (the q/k/v, o, gate/up and down projections), a mixture of experts'
whole sparse MLP (moe: router, the experts' grouped GEMMs, the combine), the LM head,
attention (the backend's paged attend and the KV cache write), RoPE and RMSNorms, and
sampling. "other" is the rest of the step (embedding, the SiLU*up product, residual adds,
batch metadata, Python). With the fused CPU kernels (runtime/model_executor/kernels/cpu.py, the default on
CPU) the residual adds count in RoPE/norms (each fused into the norm after it) and so does the
KV write (fused into RoPE); MSTAR_CPU_KERNELS=torch profiles the torch ops instead. The layers run
their kernels one by one from Python here, each call in its range: served, a model the layer stack
takes (runtime/model_executor/layers/cpu_stack.py) makes the same calls from one C++ call, without most of "other";
a last line gives both paths' decode step times, not profiled (alternated, medians of 3 rounds).
Printed: ms per step and share of the step, per category.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from runtime.worker.openmp import worker_waits

# a worker's OpenMP wait policy, before torch loads (runtime/worker/openmp.py): the profile times the
# step as the served worker runs it
worker_waits(os.environ)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402
from mstar_compiler.units import parse_size  # noqa: E402
from runtime.model_executor.sampling import SamplingParams  # noqa: E402
from runtime.transport.request_params import RequestParams  # noqa: E402
from bench import profile_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CATEGORIES = ("linears", "moe", "lm_head", "attention", "rope_norms", "sampling", "other")


def load_executor(graph: Path, preset: str | None, weights: tuple[str, ...] = (), random_weights: bool = False,
                  device_memory: int | None = None) -> Any:
    """The plan's first KV node on rank 0, loaded as a worker loads it (`weights`, `random_weights`: mstar-run's
    --weights and --random-weights; `device_memory`: mstarc's --device-memory, which sizes the KV pool)."""
    sys.path.insert(0, str(ROOT))
    from mstar_compiler.ir import Options
    from mstar_compiler.pipeline import compile_file
    from runtime.conductor.local_run import LocalRun
    from runtime.model_executor.weights.sources import WeightOptions
    from runtime.worker.executors import executor_for
    from runtime.worker.loader import load_rank
    plan = compile_file(str(graph), Options(preset=preset, device_memory=device_memory)).plan
    name = next(n.name for n in plan.nodes if n.has_kv_cache)
    module, _ = load_rank(plan, 0, WeightOptions(tuple(weights), random_weights))[name]
    # its block tables as the conductor keeps them, no prefix reuse: every run computes its whole prompt
    return LocalRun(executor_for(plan.node(name), module, 0, plan), prefix_cache=False)


def _lm(ex: Any) -> nn.Module:
    """The decoder LM the executor runs (Orpheus' executor wraps it to compute only the frame slot's columns of
    the LM head: `_SlotLM.lm`)."""
    model = ex.executor.model
    return getattr(model, "lm", model)


def _scope_module(module: nn.Module, name: str) -> None:
    """Run every forward of `module` inside record_function(name)."""
    ranges: list[Any] = []
    module.register_forward_pre_hook(lambda m, args: ranges.append(record_function(name).__enter__()))
    module.register_forward_hook(lambda m, args, out: ranges.pop().__exit__(None, None, None))


def _scoped(fn: Callable, name: str) -> Callable:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)
    return wrapped


def instrument(ex: Any) -> None:
    """Put each category's record_function range on the modules and calls that belong to it."""
    import runtime.model_executor.layers.attention as attention_layer
    from runtime.model_executor.kernels import cpu as cpu_kernels
    model = ex.executor.model
    wrapped = model is not _lm(ex)
    if wrapped:                   # the wrapper's head (Orpheus: columns, not the head module's forward)
        model.compute_logits = _scoped(model.compute_logits, "lm_head")
        model = _lm(ex)
    model.cpu_stack = False       # the layers' kernels one by one, each in its range (not one C++ call)
    scoped: list[str] = []        # a range inside another of its category would count twice
    for name, module in model.named_modules():
        kind = type(module).__name__
        category = ("lm_head" if kind == "ParallelLMHead" and not wrapped    # else inside the wrapper's range
                    else "moe" if kind == "SparseMoE" else "linears" if kind.endswith("Linear")
                    else "rope_norms" if kind in ("RMSNorm", "RotaryEmbedding") else None)
        if category is None or any(name.startswith(s + ".") for s in scoped):
            continue
        _scope_module(module, category)
        scoped.append(name)
    attention_layer.rotate = _scoped(attention_layer.rotate, "rope_norms")
    for name in ("rms_norm", "add_rms_norm", "rope_cache"):     # the fused CPU kernels (runtime/model_executor/kernels/cpu.py)
        setattr(cpu_kernels, name, _scoped(getattr(cpu_kernels, name), "rope_norms"))
    model.rotary_emb.cos_sin = _scoped(model.rotary_emb.cos_sin, "rope_norms")
    backend = model.attention_backend(ex.executor.device)
    backend.attend = _scoped(backend.attend, "attention")
    ex.executor.cache.write = _scoped(ex.executor.cache.write, "attention")
    ex.executor.sampler = _scoped(ex.executor.sampler, "sampling")


@contextlib.contextmanager
def decoding(ex: Any, batch: int, context: int) -> Iterator[Callable[[], None]]:
    """`batch` prefilled requests; yields one decode step of all of them; frees them after."""
    from runtime.transport.messages import WorkItem
    gen = torch.Generator().manual_seed(0)
    vocab = int(ex.executor.node.dims["vocab_size"])
    ids = list(range(1, batch + 1))
    for rid in ids:
        ex.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
    prompts = [WorkItem(request_id=r, tokens=torch.randint(0, vocab, (context,), generator=gen).tolist()) for r in ids]
    last = [res.tokens[0] for res in ex.run(prompts, [{}] * batch)]

    def step() -> None:
        results = ex.run([WorkItem(request_id=r, tokens=[t]) for r, t in zip(ids, last)], [{}] * batch)
        last[:] = [res.tokens[0] for res in results]
    try:
        yield step
    finally:
        for rid in ids:
            ex.close(rid, kv_only=False)


def profile_steps(ex: Any, batch: int, context: int, steps: int) -> dict[str, float]:
    """ms per decode step in each category (and "step", the whole)."""
    with decoding(ex, batch, context) as step:
        for _ in range(2):          # warm-up: first calls pick and cache kernels
            step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                with record_function("step"):
                    step()
    totals = {e.key: e.cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    out = {c: totals.get(c, 0.0) for c in CATEGORIES if c != "other"}
    out["step"] = totals["step"]
    out["other"] = max(out["step"] - sum(v for k, v in out.items() if k not in ("step", "other")), 0.0)
    return out


def stack_vs_per_layer(ex: Any, batch: int, context: int, steps: int, rounds: int = 3) -> dict[str, float]:
    """ms per decode step, not profiled, with the layers in one C++ call (runtime/model_executor/layers/cpu_stack.py; what a
    worker runs) and one kernel call at a time from Python (what the profile times): the medians of `rounds`
    alternated rounds of `steps` steps. Call before `instrument`, whose ranges would slow the second."""
    import statistics
    import time
    model, times = _lm(ex), {"stack": [], "per-layer": []}
    with decoding(ex, batch, context) as step:
        for _ in range(rounds):
            for name, mode in (("per-layer", False), ("stack", None)):
                model.cpu_stack = mode
                step()                  # warm-up (and, for the stack, its table)
                start = time.perf_counter()
                for _ in range(steps):
                    step()
                times[name].append((time.perf_counter() - start) / steps * 1e3)
    took = bool(model.cpu_stack)
    model.cpu_stack = None
    return {name: statistics.median(ms) for name, ms in times.items()} if took else {}


def profile_prefill(ex: Any, tokens: int, chunk: int) -> dict[str, float]:
    """ms of one request's prefill of `tokens` random tokens in chunks of `chunk` (as the conductor
    cuts it, `--prefill-chunk-tokens`) in each category, and ms per token in "step"."""
    from runtime.transport.messages import WorkItem
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(ex.executor.node.dims["vocab_size"]), (tokens,), generator=gen).tolist()
    ex.open(1, RequestParams(sampling=SamplingParams(temperature=0.0)))
    ex.run([WorkItem(request_id=1, tokens=ids[:chunk], partial=True)], [{}])   # warm-up, freed below
    ex.close(1, kv_only=False)
    ex.open(1, RequestParams(sampling=SamplingParams(temperature=0.0)))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("step"):
            for a in range(0, tokens, chunk):
                ex.run([WorkItem(request_id=1, tokens=ids[a:a + chunk], partial=a + chunk < tokens)], [{}])
    ex.close(1, kv_only=False)
    totals = {e.key: e.cpu_time_total / 1e3 for e in prof.key_averages()}
    out = {c: totals.get(c, 0.0) for c in CATEGORIES if c != "other"}
    out["step"] = totals["step"]
    out["other"] = max(out["step"] - sum(v for k, v in out.items() if k not in ("step", "other")), 0.0)
    return out


def table(rows: dict[int, dict[str, float]], column: str = "batch") -> str:
    """Markdown: one row per category, one column per batch or prompt length (ms and share)."""
    return profile_table.table(rows, CATEGORIES, column)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--graph", type=Path, default=ROOT / "graphs/smollm2.yaml")
    p.add_argument("--preset", default=None, help="graph preset (default: the graph's own)")
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--context", type=int, default=64, help="prompt tokens of each request before decoding")
    p.add_argument("--steps", type=int, default=5, help="profiled decode steps per batch size")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--prefill", default="", help="comma-separated prompt lengths: profile one chunked prefill "
                                                 "of each instead of decode steps")
    p.add_argument("--chunk", type=int, default=256, help="prefill chunk (the server's --prefill-chunk-tokens)")
    p.add_argument("--weights", action="append", default=[], help="as mstar-run's: ROOT, or NAME=DIR")
    p.add_argument("--random-weights", action="store_true", help="seeded random weights where none are given")
    p.add_argument("--device-memory", type=parse_size, default=None,
                   help="as mstarc's (e.g. 8GiB): the KV pool is what the weights leave of it")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ex = load_executor(args.graph, args.preset, tuple(args.weights), args.random_weights, args.device_memory)
    if args.prefill:
        instrument(ex)
        rows = {n: profile_prefill(ex, n, args.chunk) for n in map(int, args.prefill.split(","))}
        print(f"chunked prefill of {ex.executor.node.name} ({args.graph.name}, preset {args.preset or 'default'}), "
              f"{torch.get_num_threads()} threads, chunks of {args.chunk}, one request per prompt length (ms)")
        print(table(rows, "tokens"))
        return 0
    batches = [int(b) for b in args.batches.split(",")]
    unprofiled = {b: stack_vs_per_layer(ex, b, args.context, args.steps) for b in batches}
    instrument(ex)
    rows = {b: profile_steps(ex, b, args.context, args.steps) for b in batches}
    print(f"decode step of {ex.executor.node.name} ({args.graph.name}, preset {args.preset or 'default'}), "
          f"{torch.get_num_threads()} threads, context {args.context}, mean of {args.steps} steps")
    print(table(rows))
    if all(unprofiled.values()):
        print("not profiled, the layers' kernels one by one from Python (as above) vs in one C++ call (served): "
              + "; ".join(f"batch {b} {t['per-layer']:.1f} vs {t['stack']:.1f} ms" for b, t in unprofiled.items()))
    else:
        print("the layer stack does not take this model (runtime/model_executor/layers/cpu_stack.py): served as profiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
