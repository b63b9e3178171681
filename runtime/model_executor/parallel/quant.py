"""Weight-only quantized linears on CPU: int8 per output channel, int4 in groups of 32 input features.

A node declared `quant:` in its graph (mstar_compiler.quant) keeps the weights of its decoder linears
(attention q/k/v and o, the MLP's gate/up and down, every MoE expert's) quantized, their only copy;
embeddings, norms, routers and the LM head stay in the node's dtype. Schemes:

* "int8": w[n, k] ~ scale[n] * q[n, k], q in [-127, 127] (symmetric), scale = max |w[n, :]| / 127.
* "int4_g32": w[n, k] ~ (q[n, k] - 8) * scale[n, g] + zero[n, g] for g = k // 32, q in [0, 15]
  (asymmetric: scale = (max - min) / 15, zero = min + 8 scale over the group), torch's int4 layout.

Scales and zeros are held in the activation dtype (the node's), as torch's kernels take them; codes are
rounded against the stored (rounded) scale, so a weight's dequantised value is exactly what the kernel
multiplies by. Quantizing is deterministic: the same weights give the same codes on any machine.

Kernels, chosen per weight as it is quantized by `quant_kernel` (MSTAR_CPU_QUANT: auto, amx or torch):
* "amx": runtime/model_executor/kernels/cpu_quant.cpp, bf16 activations on CPUs with AMX-BF16 tiles: each weight
  tile made from its codes in registers, exactly (int8: the codes; int4: 128 + q), multiplied on the tiles with
  fp32 sums, the scales (and int4's zeros) applied to those sums. Codes in its blocked layout, scales (and zeros)
  in bf16: the same bytes as torch's.
* "torch": torch's `_weight_int8pack_mm` (int8 codes, per-channel scales) and `_weight_int4pack_mm_for_cpu`
  (codes packed by `_convert_weight_to_int4pack_for_cpu`, scales and zeros as (k/32, n, 2)), elsewhere (and
  for fp32 activations, which torch runs on a generic loop).
Both accumulate in fp32; their results differ from `x @ dequantised.T` by the order of that sum and by the
rounding of the output to the activation dtype.

Built as loaded: a linear told `quant_as_loaded(scheme)` while its model is built (runtime.worker.loader's
`cast_as_built`) gives up its dense weight at once (a meta stand-in, `cpu_linear.dense_gone`) and gathers
each loaded part's rows into an `Assembly`, quantized when its last row arrives: a model's dense weights
are never resident together (only the one linear being assembled).

Exact codes from GGUF: a GGUF tensor stored in Q4_0 or Q4_1 blocks of 32 is handed to its slot with its
blocks (`Int4Blocks`, `with_blocks`), and an int4_g32 linear takes those codes, scales and zeros instead of
quantizing the de-quantised values again: the served weights are the file's. Q4_0 (w = d (q - 8)) maps
with zero 0 exactly; Q4_1 (w = d q + m) maps as zero = m + 8 d, one fp32 rounding of that sum, exact where
the scales are held in fp32 (an fp32 node; a bf16 node rounds d and m to bf16). Q8_0 blocks (one scale per
32) have no per-channel int8 equivalent: an int8 node quantizes their de-quantised values per channel.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from runtime.model_executor.kernels import cpu as cpu_kernels

SCHEMES = ("int8", "int4_g32")
GROUP = 32                  # int4_g32's group of input features
INT4_MID = 8                # torch's int4 codes are centred: w = (q - 8) * scale + zero


@dataclass(frozen=True)
class Int4Blocks:
    """A weight's int4 codes as a GGUF file stores them, in torch's convention: rows of codes in [0, 15],
    per (row, group of 32) an fp32 scale and zero, w = (q - 8) * scale + zero. `source`: e.g. "GGUF Q4_1"."""

    codes: torch.Tensor     # (n, k) uint8
    scale: torch.Tensor     # (n, k / 32) float32
    zero: torch.Tensor      # (n, k / 32) float32
    source: str

    def take(self, rows: slice = slice(None), cols: slice = slice(None)) -> "Int4Blocks":
        """The blocks of weight[rows, cols]; `cols` must start and end on group boundaries."""
        start, stop = cols.start or 0, self.codes.shape[1] if cols.stop is None else cols.stop
        if start % GROUP or stop % GROUP:
            raise ValueError(f"columns {start}:{stop} cut a block of {GROUP}")
        groups = slice(start // GROUP, stop // GROUP)
        return Int4Blocks(self.codes[rows, cols], self.scale[rows, groups], self.zero[rows, groups], self.source)


def with_blocks(values: torch.Tensor, blocks: Int4Blocks) -> torch.Tensor:
    """`values` (the de-quantised weight) carrying `blocks` to the linear that loads it."""
    values.int4_blocks = blocks
    return values


def blocks_of(values: torch.Tensor) -> Int4Blocks | None:
    return getattr(values, "int4_blocks", None)


def take(values: torch.Tensor, rows: slice = slice(None), cols: slice = slice(None)) -> torch.Tensor:
    """values[rows, cols], its int4 blocks (if any) sliced alike (a tensor-parallel shard of a GGUF weight)."""
    part = values[rows, cols]
    blocks = blocks_of(values)
    return with_blocks(part, blocks.take(rows, cols)) if blocks is not None else part


@dataclass(eq=False)
class QuantWeight:
    """One linear's weight, quantized (module doc): its codes and scales, and the GEMM on them."""

    scheme: str
    n: int                  # output features
    k: int                  # input features
    data: torch.Tensor      # int8: (n, k) int8; int4_g32: torch's packed (n, k / 2) uint8
    scales: torch.Tensor    # int8: (n,); int4_g32: (k / 32, n, 2) scale and zero (amx: per 16 outputs and group, 16
                            # scales then 16 zeros); in the activation dtype
    exact: str = ""         # where its codes came from as they are ("GGUF Q4_1"), "" if quantized here
    kernel: str = "torch"   # "amx" or "torch" (module doc): the layout of `data` and `scales`

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.scales.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., k) @ w^T -> (..., n) in x's dtype."""
        if x.dtype != self.dtype or x.device.type != "cpu":
            raise RuntimeError(f"a {x.dtype} input on {x.device} to a {self.scheme} linear quantized for "
                               f"{self.dtype} on the CPU")
        rows = x.reshape(-1, self.k)
        if not rows.is_contiguous():
            rows = rows.contiguous()
        if self.kernel == "amx":
            out = cpu_kernels.quant_gemm(rows, self.data, self.scales, self.scheme == "int4_g32", self.n)
        elif self.scheme == "int8":
            out = torch.ops.aten._weight_int8pack_mm(rows, self.data, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.data, GROUP, self.scales)
        return out.reshape(*x.shape[:-1], self.n)


KERNELS = ("auto", "amx", "torch")


def quant_kernel(dtype: torch.dtype, n: int, k: int, choice: str | None = None) -> str:
    """The kernel a (n, k) weight quantized for `dtype` activations runs on: "amx" or "torch" (module doc);
    `choice` (auto, amx or torch) over the process's MSTAR_CPU_QUANT."""
    choice = choice or os.environ.get("MSTAR_CPU_QUANT", "auto")
    if choice not in KERNELS:
        raise ValueError(f"MSTAR_CPU_QUANT={choice!r}: choose one of {', '.join(KERNELS)}")
    fits = dtype == torch.bfloat16 and n % cpu_kernels.QUANT_COLS == 0 and k % cpu_kernels.QUANT_DEPTH == 0
    if choice == "amx" and not (fits and cpu_kernels.quant_amx()):
        raise RuntimeError(f"the amx quantized kernel was asked for, but a ({n}, {k}) weight for {dtype} activations cannot run there "
                           f"(bf16, outputs in 16s and inputs in 32s, on a CPU with AMX-BF16: {cpu_kernels.quant_amx()})")
    return "amx" if choice != "torch" and fits and cpu_kernels.quant_amx() else "torch"


def check_shape(scheme: str, n: int, k: int) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"quant {scheme!r}: choose one of {', '.join(SCHEMES)}")
    if scheme == "int4_g32" and k % GROUP:
        raise ValueError(f"int4_g32 needs input features in whole groups of {GROUP}; this linear has {k}")


@torch.no_grad()
def quantize(weight: torch.Tensor, scheme: str, dtype: torch.dtype | None = None,
             kernel: str | None = None) -> QuantWeight:
    """`weight` (n, k) quantized by `scheme`, its scales in `dtype` (default: the weight's), laid out for `kernel`
    (auto, amx or torch; default MSTAR_CPU_QUANT: `quant_kernel`)."""
    n, k = weight.shape
    check_shape(scheme, n, k)
    dtype = dtype or weight.dtype
    w = weight.detach().float()
    if scheme == "int8":
        scale = (w.abs().amax(dim=1) / 127).to(dtype)
        safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
        return int8_weight(torch.round(w / safe[:, None]).clamp_(-127, 127).to(torch.int8), scale, kernel)
    groups = w.view(n, k // GROUP, GROUP)
    low, high = groups.amin(dim=2), groups.amax(dim=2)
    scale = ((high - low) / 15).to(dtype)
    zero = (low + INT4_MID * scale.float()).to(dtype)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
    codes = torch.round((groups - zero.float()[..., None]) / safe[..., None]).add_(INT4_MID).clamp_(0, 15)
    return int4_weight(codes.view(n, k).to(torch.uint8), scale, zero, kernel=kernel)


def int8_weight(codes: torch.Tensor, scale: torch.Tensor, kernel: str | None = None) -> QuantWeight:
    """An int8 weight from codes (n, k) in [-127, 127] and a scale per row (its dtype the activation's)."""
    n, k = codes.shape
    if quant_kernel(scale.dtype, n, k, kernel) == "amx":
        return QuantWeight("int8", n, k, cpu_kernels.quant_pack(codes, int4=False), scale.contiguous(), kernel="amx")
    return QuantWeight("int8", n, k, codes.contiguous(), scale.contiguous())


def int4_weight(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, exact: str = "",
                kernel: str | None = None) -> QuantWeight:
    """An int4_g32 weight from codes (n, k) in [0, 15] and per-(row, group) scale and zero (their dtype the
    activation's)."""
    n, k = codes.shape
    check_shape("int4_g32", n, k)
    if quant_kernel(scale.dtype, n, k, kernel) == "amx":
        cols = cpu_kernels.QUANT_COLS       # per block of 16 outputs and group: its 16 scales, then its 16 zeros
        blocked = torch.stack([t.view(n // cols, cols, k // GROUP).transpose(1, 2) for t in (scale, zero)], dim=2)
        return QuantWeight("int4_g32", n, k, cpu_kernels.quant_pack(codes, int4=True), blocked.contiguous(), exact,
                           kernel="amx")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    scales = torch.stack([scale.t(), zero.t()], dim=-1).contiguous()
    return QuantWeight("int4_g32", n, k, packed, scales, exact)


def quantized_weights(module: torch.nn.Module) -> list[QuantWeight]:
    """Every quantized weight under `module`: a linear's `packed`, or each expert's pair of an MoE's."""
    found = []
    for m in module.modules():
        packed = getattr(m, "packed", None)
        if isinstance(packed, QuantWeight):
            found.append(packed)
        elif isinstance(packed, list):          # an MoE's experts, [gate_up, down] each
            found += [w for pair in packed for w in pair if isinstance(w, QuantWeight)]
    return found


class Assembly:
    """One quantized weight's rows gathered as they load (q, k, v; gate, up; or all at once), quantized
    when the last row arrives (module doc). Rows given with GGUF int4 blocks keep their codes (int4_g32)."""

    def __init__(self, n: int, k: int, scheme: str, dtype: torch.dtype) -> None:
        check_shape(scheme, n, k)
        self.n, self.k, self.scheme, self.dtype = n, k, scheme, dtype
        self.dense: torch.Tensor | None = None
        self.blocks: list[tuple[slice, Int4Blocks]] = []
        self.filled = 0

    @torch.no_grad()
    def put(self, rows: slice, values: torch.Tensor) -> QuantWeight | None:
        """Copy `values` into rows `rows`; the quantized weight once every row is in, else None."""
        if self.dense is None:
            self.dense = torch.empty(self.n, self.k, dtype=torch.float32)
        self.dense[rows].copy_(values)
        blocks = blocks_of(values)
        if blocks is not None and self.scheme == "int4_g32":
            self.blocks.append((rows, blocks))
        self.filled += self.dense[rows].shape[0]
        if self.filled < self.n:
            return None
        dense, self.dense, self.filled = self.dense, None, 0
        blocks_held, self.blocks = self.blocks, []
        if blocks_held and sum(b.codes.shape[0] for _, b in blocks_held) == self.n:
            return self._from_blocks(blocks_held)
        return quantize(dense, self.scheme, self.dtype)

    def _from_blocks(self, parts: list[tuple[slice, Int4Blocks]]) -> QuantWeight:
        codes = torch.empty(self.n, self.k, dtype=torch.uint8)
        scale = torch.empty(self.n, self.k // GROUP)
        zero = torch.empty(self.n, self.k // GROUP)
        for rows, blocks in parts:
            codes[rows], scale[rows], zero[rows] = blocks.codes, blocks.scale, blocks.zero
        sources = sorted({blocks.source for _, blocks in parts})
        return int4_weight(codes, scale.to(self.dtype), zero.to(self.dtype), exact=" + ".join(sources))
