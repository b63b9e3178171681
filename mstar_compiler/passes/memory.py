"""Pass 7, memory: weight bytes per rank (catalogue num_params x dtype bytes, split by TP,
loaded once per rank per `same_as` group) and KV pool blocks per KV node per rank, from
the device memory budget. A model that does not fit is a CompileError.
"""
from __future__ import annotations

from mstar_compiler import plan, quant
from mstar_compiler.errors import Path
from mstar_compiler.ir import IR, NodeIR
from mstar_compiler.passes.place import all_ranks
from mstar_compiler.units import format_size

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MEMORY_UTILISATION = 0.90      # share of device memory the plan may use (the rest: allocator, CUDA context)
ACTIVATION_SHARE = 0.05        # share of device memory kept for activations and capture buffers


def run(ir: IR) -> IR:
    usable = int(ir.device_memory * MEMORY_UTILISATION)
    reserve = int(ir.device_memory * ACTIVATION_SHARE)
    for node in ir.nodes.values():
        assert node.placement is not None
        if node.quant and (why := quant.why_not(node.spec, node.dims, node.quant, node.placement.tp_size)):
            raise ir.doc.error(f"node '{node.name}' cannot be quantized at tp={node.placement.tp_size}: {why}",
                               node.quant_path)
    weights = _weights_per_rank(ir)
    for rank in range(ir.num_ranks):
        if weights[rank] + reserve > usable:
            raise _does_not_fit(ir, rank, weights[rank], usable, reserve)
        _kv_pools(ir, rank, usable - reserve - weights[rank])
    ir.ranks = [_rank(ir, r, weights[r], reserve) for r in range(ir.num_ranks)]
    return ir


def weight_bytes(node: NodeIR) -> int:
    """Bytes of `node`'s full weights (before any TP split), its quantized linears at their size."""
    return quant.weight_bytes(node.spec, node.dims, DTYPE_BYTES[node.dtype], node.quant)


def _weights_per_rank(ir: IR) -> list[int]:
    per_rank = [0] * ir.num_ranks
    loaded: set[tuple[str, int]] = set()
    for node in ir.nodes.values():
        assert node.placement is not None
        share = weight_bytes(ir.nodes[node.weight_key]) // node.placement.tp_size
        for r in all_ranks(node):
            if (node.weight_key, r) not in loaded:
                loaded.add((node.weight_key, r))
                per_rank[r] += share
    return per_rank


def _placement_path(ir: IR) -> Path:
    return ("placements", ir.placement_name) if ir.doc.data.get("placements") else ("nodes",)


def _does_not_fit(ir: IR, rank: int, weights: int, usable: int, reserve: int):
    names = [n.name for n in ir.nodes.values() if rank in all_ranks(n)]
    return ir.doc.error(
        f"model does not fit: rank {rank} holds {format_size(weights)} of weights ({', '.join(names)}), "
        f"more than {format_size(usable - reserve)} available of {format_size(ir.device_memory)} device memory",
        _placement_path(ir), "spread nodes over more ranks, raise tp, choose a smaller --preset, "
                             "or pass a larger --device-memory")


def _block_bytes(ir: IR, node: NodeIR) -> int:
    per_token = node.spec.kv_bytes_per_token
    if per_token is None:
        raise ir.doc.error(f"kind '{node.kind}' keeps a KV cache but its catalogue entry gives no "
                           "kv_bytes_per_token", node.path, "fix the kind's catalogue entry")
    assert node.placement is not None
    return node.block_tokens * per_token(node.dims, DTYPE_BYTES[node.dtype]) // node.placement.tp_size


def _kv_pools(ir: IR, rank: int, free: int) -> None:
    """Split `free` bytes so every KV node on `rank` holds the same number of blocks."""
    kv_nodes = [n for n in ir.nodes.values() if n.has_kv_cache and rank in all_ranks(n)]
    if not kv_nodes:
        return
    block_bytes = {n.name: _block_bytes(ir, n) for n in kv_nodes}
    blocks = free // max(1, sum(block_bytes.values()))
    if blocks < 1:
        raise ir.doc.error(f"no memory left for KV cache on rank {rank}: {format_size(free)} free after weights",
                           _placement_path(ir), "pass a larger --device-memory or spread nodes over more ranks")
    for node in kv_nodes:
        num = min(blocks, node.max_blocks) if node.max_blocks else blocks
        node.kv_pools.append(plan.KVPool(rank, num, node.block_tokens, block_bytes[node.name]))


def _rank(ir: IR, rank: int, weights: int, activations: int) -> plan.Rank:
    nodes = [n for n in ir.nodes.values() if rank in all_ranks(n)]
    kv = sum(p.num_blocks * p.block_bytes for n in nodes for p in n.kv_pools if p.rank == rank)
    return plan.Rank(rank, ir.device_memory, weights, kv, [n.name for n in nodes], activations)
