"""Weight-only quantization as the compiler sees it: the schemes, which kinds take them, and their bytes.

A graph declares `quant:` per node (`nodes: {lm: {kind: llama_lm, quant: int4_g32}}`) or per preset
(`presets: {p: {quant: {lm: int8}}}`, which wins; `none` there serves a node's weights as they are). The
kind's `quant_linears` (mstar_compiler.catalogue) lists the linears that quantize — its decoder layers'
attention, MLP and expert weights; embeddings, norms, routers and the LM head stay in the node's dtype — and
the memory pass counts those at their quantized size (`mstarc explain` shows it). The runtime side, and what
each scheme means, is runtime/model_executor/parallel/quant.py.
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, KindSpec

SCHEMES = ("int8", "int4_g32")
GROUP = 32                  # int4_g32's group of input features


def linear_bytes(scheme: str, n: int, k: int, dtype_bytes: int) -> int:
    """Resident bytes of one (n, k) weight quantized by `scheme`, its scales (and zeros) in the node's dtype."""
    if scheme == "int8":
        return n * k + n * dtype_bytes                      # codes, one scale per output
    return n * k // 2 + 2 * (k // GROUP) * n * dtype_bytes   # packed nibbles, a scale and a zero per group


def weight_bytes(spec: KindSpec, dims: Dims, dtype_bytes: int, scheme: str) -> int:
    """The node's weights: its parameters at `dtype_bytes`, but its quantized linears at their scheme's size."""
    total = spec.num_params(dims) * dtype_bytes
    if scheme and spec.quant_linears is not None:
        for lin in spec.quant_linears(dims):
            total += lin.count * (linear_bytes(scheme, lin.n, lin.k, dtype_bytes) - lin.n * lin.k * dtype_bytes)
    return total


def why_not(spec: KindSpec, dims: Dims, scheme: str, tp_size: int = 1) -> str | None:
    """Why a node of `spec` cannot be quantized by `scheme` (at `tp_size` ranks), or None when it can."""
    if spec.quant_linears is None:
        return f"kind '{spec.kind}' has no linears mstar quantizes (quant: applies to decoder LM kinds)"
    if scheme != "int4_g32":
        return None
    for lin in spec.quant_linears(dims):
        k = lin.k // tp_size if lin.splits_input else lin.k
        if k % GROUP:
            split = f" ({lin.k} split over {tp_size} ranks)" if lin.splits_input and tp_size > 1 else ""
            return f"int4_g32 quantizes whole groups of {GROUP} input features; a ({lin.n}, {lin.k}) weight has {k}{split}"
    return None
