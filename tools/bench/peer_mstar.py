"""mstar-run as the served side of the chat and prefill comparisons, and the plans the suites compile.

`mstar_peer` starts `mstar-run` on graphs/smollm2.yaml's plan (its `smollm2-135m-bf16` preset for
bfloat16) in a cache mode (cold: `--no-prefix-cache`) and reads back what it runs with: /v1/models'
`prefix_cache`, dtypes and `cpu_kernels` (its fused CPU kernels, built `-march=native` for this CPU, or
why its layers run torch's ops), /metrics' worker threads, the CPUs each worker process may run on
(/proc, by /health's worker pids: it binds none) and the plan's KV pool, the budget the peers get too.
Its prefix-cache counters are /metrics' `mstar_prefix_cache_{query,hit}_tokens`.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.cache_state import COLD
from bench.openai_load import model_card
from bench.peers import Peer, cpu_isa_flags, get_text, process_threads, prometheus_total, prometheus_values
from bench.registry import Context, Needs
from bench.servers import Server, mstar_run

COMPILE_START_S = 1800.0     # --cpu-compile: a cold start compiles six batch buckets (minutes each on 2 cores)


def compile_plan(graph: Path, plan: Path, *options: str) -> Path:
    """`mstarc compile graph -o plan [options]`; a failure is a `Needs` with mstarc's message."""
    mstarc = Path(sys.executable).parent / "mstarc"
    plan.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(mstarc), "compile", str(graph), "-o", str(plan), *options], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise Needs(f"`mstarc compile {graph.name}` failed: {done.stderr.strip()[-300:]}")
    return plan


def mstar_plan(ctx: Context, dtype: str) -> Path:
    """Compile graphs/smollm2.yaml (its `smollm2-135m-bf16` preset for bfloat16, `smollm2-135m-q4` for "q4_1": the
    shipped Q4_1 file served as int4) to a plan under bench-results/;
    with `--cpu-compile`, a copy of the graph whose lm node sets `args: {cpu_compile: true}`."""
    graph, out = ctx.root / "graphs/smollm2.yaml", ctx.root / "bench-results/plans"
    mstarc = Path(sys.executable).parent / "mstarc"
    if not graph.is_file() or not (ctx.root / "runtime/entrypoints/http/app.py").is_file() or not mstarc.exists():
        raise Needs("mstar-run's chat serving: graphs/smollm2.yaml, runtime/entrypoints/http/app.py and mstarc")
    options = {"bfloat16": ("--preset", "smollm2-135m-bf16"), "q4_1": ("--preset", "smollm2-135m-q4")}.get(dtype, ())
    ctx.settings["mstar_cpu_compile"] = ctx.cpu_compile
    if not ctx.cpu_compile:
        return compile_plan(graph, out / f"smollm2-{dtype}.plan.bin", *options)
    raw = yaml.safe_load(graph.read_text())
    raw["nodes"]["lm"].setdefault("args", {})["cpu_compile"] = True
    out.mkdir(parents=True, exist_ok=True)
    compiled = out / "smollm2-cpu-compile.yaml"
    compiled.write_text(yaml.safe_dump(raw, sort_keys=False))
    return compile_plan(compiled, out / f"smollm2-{dtype}-cpu-compile.plan.bin", *options)


def kv_bytes(plan: Path) -> int:
    """Bytes of the KV pools a compiled plan gives its ranks (what `mstarc explain` prints as KV)."""
    from mstar_compiler.plan import load_plan

    return sum(rank.kv_bytes for rank in load_plan(plan).ranks)


def mstar_server(ctx: Context, dtype: str, threads: int | None = None, *flags: str) -> Server:
    """mstar-run on the compiled plan; `threads` pins its processes' torch/OpenMP threads."""
    return mstar_run(mstar_plan(ctx, dtype), ctx.root / "bench-results/logs" / f"mstar-{dtype}.log",
                     f"mstar-run ({dtype})", threads, *flags,
                     start_timeout_s=COMPILE_START_S if ctx.cpu_compile else 600.0)


def check_dtype(card: dict[str, Any], dtype: str) -> None:
    """mstar counts as bf16 only if its model card says the plan's dtype is what it runs."""
    said = card.get("dtype", "fp32")    # node -> dtype
    if dtype == "bfloat16" and (not isinstance(said, dict) or set(said.values()) != {"bf16"}):
        raise Needs(f"mstar-run to run a bf16 plan in bf16 and say so in /v1/models (`dtype`); its card says "
                    f"{card.get('dtype')!r}, so a bf16 figure would really be fp32")


def mstar_peer(ctx: Context, stack: contextlib.ExitStack, dtype: str, mode: str, label: str, kv_budget: int,
               threads: int | None = None, *flags: str) -> Peer:
    """mstar-run serving SmolLM2 in `dtype` and cache `mode`; `kv_budget`: its plan's pool (`kv_bytes`);
    `flags` are mstar-run's own."""
    cache = ("--no-prefix-cache",) if mode == COLD else ()
    srv = stack.enter_context(mstar_server(ctx, dtype, threads, *cache, *flags))
    check_dtype(model_card(srv.url), dtype)
    return started_peer(srv, label, [*cache, *flags], threads, kv_budget)


def started_peer(srv: Server, label: str, flags: list[str], threads: int | None, kv_budget: int) -> Peer:
    """The `Peer` of a started mstar-run (any plan): its model id, cache state and settings as it reports them."""
    card = model_card(srv.url)
    settings = {**_settings(srv, card, flags, threads), "kv_budget_bytes": kv_budget,
                "kv_budget_source": "the plan's KV pools"}
    return Peer("mstar", label, srv, card["id"], bool(card.get("prefix_cache")),
                "/v1/models prefix_cache, /metrics mstar_prefix_cache_{query,hit}_tokens",
                lambda: _counters(srv.url), settings)


def _settings(srv: Server, card: dict[str, Any], flags: list[str], threads: int | None) -> dict[str, Any]:
    import torch

    metrics = get_text(srv.url + "/metrics")
    health = json.loads(get_text(srv.url + "/health"))
    kernels = {node: info.get("cpu_kernels") for rank in card.get("ranks", {}).values() for node, info in rank.items()}
    return {"flags": flags, "dtype": card.get("dtype"), "omp_num_threads": threads,
            "worker_threads": prometheus_values(metrics, "mstar_worker_threads"),
            "worker_threads_allotted": prometheus_values(metrics, "mstar_worker_threads_allotted"),
            "workers": [process_threads(pid) for pid in health.get("worker_pids", {}).values()],
            "binding": "none: workers run on every CPU the kernel allows (mstar-run binds no thread)",
            "isa": {"cpu_kernels": kernels, "built": "-march=native for this CPU (runtime/model_executor/kernels/cpu.py)",
                    "cpu_flags": cpu_isa_flags(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}}


def _counters(url: str) -> tuple[int, int]:
    text = get_text(url + "/metrics")
    return (prometheus_total(text, "mstar_prefix_cache_query_tokens"),
            prometheus_total(text, "mstar_prefix_cache_hit_tokens"))
