"""attention: the CPU attention kernels alone, on SmolLM2-135M's heads (9 query / 3 kv heads of 64).

Decode rows: one `paged_decode` call per layer over 30 layers' caches in turn (each layer's cache
its own tensor, so a step's KV comes from memory, as in serving), 16 requests x 256 cached tokens.
  mstar:    block tables as the KV allocator lays them (runtime/model_executor/kv/block_allocator.py: runs), from a
            `KVBlockManager` where 16 requests prefill 32 tokens, then grow a token each in turn
  baseline: the same blocks interleaved one by one (block j of request b is j * 16 + b), as a
            first-free allocator laid them before runs
Prefill rows: one 256-row chunk's attention after 0 / 3,840 / 7,936 cached tokens, fp32.
  mstar:    `runtime.model_executor.kernels.cpu.paged_prefill` (runtime/model_executor/kernels/cpu_prefill.cpp)
  baseline: the torch backend's chunk attention (torch's fused SDPA, one masked call per chunk)
"""
from __future__ import annotations

import torch

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import LOWER, median_time

HQ, HKV, D, BLOCK, LAYERS = 9, 3, 64, 16, 30
REQUESTS, PROMPT, CONTEXT = 16, 32, 256
CHUNK, CONTEXTS, QUICK_CONTEXTS = 256, (0, 3840, 7936), (0, 3840)
CALLS = 5                         # timed passes per sample (the median is kept)
RUNS = "block tables as the KV allocator lays them (runs), 16 requests grown side by side"
SCATTERED = "the same blocks interleaved one by one (a first-free allocator's layout)"
PREFILL = "runtime.model_executor.kernels.cpu.paged_prefill (flash-style over the paged cache)"
SDPA = "the torch backend's chunk attention (torch's fused SDPA over the gathered cache)"


def allocator_tables() -> torch.Tensor:
    """(REQUESTS, CONTEXT / BLOCK) block ids as a KVBlockManager lays 16 decodes growing side by side."""
    from runtime.model_executor.kv import KVBlockManager
    manager = KVBlockManager(num_blocks=REQUESTS * CONTEXT // BLOCK, block_size=BLOCK)
    for r in range(REQUESTS):
        manager.allocate(r, PROMPT)
    for _ in range(CONTEXT - PROMPT):
        for r in range(REQUESTS):
            manager.append(r, 1)
    return torch.tensor([manager.table(r).blocks for r in range(REQUESTS)], dtype=torch.long)


def scattered_tables() -> torch.Tensor:
    width = CONTEXT // BLOCK
    return torch.arange(REQUESTS * width).view(width, REQUESTS).t().contiguous()


def _median_us(fn, per: int) -> float:
    return median_time(fn, CALLS) / per * 1e6


def _decode_rows(ctx: Context, dtype: torch.dtype, name: str) -> Row:
    from runtime.model_executor.kernels import cpu as cpu_kernels
    num_blocks = REQUESTS * CONTEXT // BLOCK
    caches = [(torch.randn(num_blocks, BLOCK, HKV, D).to(dtype), torch.randn(num_blocks, BLOCK, HKV, D).to(dtype))
              for _ in range(LAYERS)]
    q, lengths = torch.randn(REQUESTS, HQ, D).to(dtype), torch.full((REQUESTS,), CONTEXT, dtype=torch.long)

    def step(tables: torch.Tensor):
        def run() -> None:
            for k, v in caches:
                cpu_kernels.paged_decode(q, k, v, tables, lengths, D ** -0.5)
        return lambda: {"us": _median_us(run, LAYERS)}
    samples = ctx.alternate(f"attention decode {name}", {"mstar": step(allocator_tables()),
                                                        "baseline": step(scattered_tables())})
    kv_mb = 2 * REQUESTS * CONTEXT * HKV * D * caches[0][0].element_size() / 1e6
    return Row(f"decode, {name}, {REQUESTS} requests x {CONTEXT} tokens, {LAYERS} layers' caches in turn",
               "one layer's decode attention", "µs", LOWER, Side(RUNS, samples["mstar"]["us"]),
               Side(SCATTERED, samples["baseline"]["us"]), names=("runs", "scattered"),
               note=f"{kv_mb:.1f} MB of KV a layer, read from memory")


def _prefill_row(ctx: Context, context: int) -> Row:
    from runtime.model_executor.attention.torch_backend import _attend_prefill, _PrefillChunk
    from runtime.model_executor.kernels import cpu as cpu_kernels
    seq = context + CHUNK
    num_blocks = -(-seq // BLOCK)
    k_cache, v_cache = torch.randn(num_blocks, BLOCK, HKV, D), torch.randn(num_blocks, BLOCK, HKV, D)
    blocks, q = torch.randperm(num_blocks), torch.randn(CHUNK, HQ, D)
    chunk = _PrefillChunk(slice(0, CHUNK), seq, blocks)
    sides = {"mstar": lambda: cpu_kernels.paged_prefill(q, k_cache, v_cache, blocks, context, D ** -0.5),
             "baseline": lambda: _attend_prefill(q, k_cache, v_cache, chunk, D ** -0.5)}
    samples = ctx.alternate(f"attention prefill {context}", {
        name: (lambda fn=fn: {"ms": _median_us(fn, 1) / 1e3}) for name, fn in sides.items()})
    gflop = 4 * HQ * D * CHUNK * (context + CHUNK / 2) / 1e9
    return Row(f"prefill, float32, a {CHUNK}-row chunk after {context} cached tokens", "the chunk's attention", "ms",
               LOWER, Side(PREFILL, samples["mstar"]["ms"]), Side(SDPA, samples["baseline"]["ms"]),
               note=f"{gflop:.2f} GFLOP (causal)")


@register("attention", "CPU attention kernels alone: decode over blocks in runs vs scattered; prefill vs torch SDPA")
def run(ctx: Context) -> list[Row]:
    from runtime.model_executor.kernels import cpu as cpu_kernels
    if cpu_kernels.status():
        raise Needs(f"the fused CPU kernels: {cpu_kernels.status()}")
    contexts = QUICK_CONTEXTS if ctx.quick else CONTEXTS
    ctx.settings.update(heads=(HQ, HKV, D), block=BLOCK, layers=LAYERS, requests=REQUESTS, context=CONTEXT,
                        chunk=CHUNK, contexts=list(contexts), threads=torch.get_num_threads())
    rows = [_decode_rows(ctx, dtype, name) for dtype, name in ((torch.float32, "float32"),
                                                               (torch.bfloat16, "bfloat16"))]
    return rows + [_prefill_row(ctx, context) for context in contexts]
