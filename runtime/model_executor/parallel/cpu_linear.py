"""Linear layers on CPU with each weight packed once after loading, for one of two GEMM kernels.

torch's fp32 `F.linear` on CPU calls MKL's sgemm, which runs decode-sized GEMMs (16 x 576 x
1728) far below what a kernel reading a weight laid out for it does. Two such kernels, chosen
per process and weight dtype by `gemm_kernel(dtype)` (`MSTAR_CPU_LINEAR`: auto, mstar, onednn or torch):

* "mstar": runtime/model_executor/kernels/cpu.cpp's panel GEMM (weights in 16-column k-major panels, register
  blocks of rows over one to three panels by the CPU's vector width and the batch's row count, each
  output one in-order sum over k, whatever the batch; bf16 through AVX512-BF16's `vdpbf16ps` where the
  CPU has it). It takes bf16 weights on any CPU (without bf16 instructions: converted to
  fp32 in registers). `auto` picks it wherever it builds, except for bf16 weights on CPUs with AMX: on
  every CPU measured it ran SmolLM2's decode GEMMs faster than oneDNN, in fp32 and bf16 alike, except
  bf16 on AMX, where oneDNN's tile kernels lead from 8–16 rows on (behind at 1–4 rows).
* "onednn": oneDNN with the weight reordered into its blocked layout (the op torch's own
  compiler uses after freezing). bf16 needs oneDNN's bf16 kernels for the CPU (AVX-512 BW/VL/DQ,
  AVX-NE-CONVERT or AMX); without them bf16 weights stay unpacked.
* "torch": nothing packed, `F.linear` (also where neither kernel is available).

`python tools/bench.py linear` measures the chosen kernel against F.linear on the same
weights and `python tools/bench.py kernels` the two kernels against each other; the figures are in
docs/benchmark-log.md.

One copy of each weight. `pack_linears(module)` runs after a rank's weights are loaded
(runtime.worker.loader): every linear of the module tree on CPU packs its weight and gives up the dense
one, whose parameter becomes a stand-in on the meta device (`dense_gone`: same name, shape and dtype, so
the plan's weight count and the module's structure stand; any read of it fails loudly instead of running
on stale data). A table that is also read by rows (an embedding tied to its LM head) is packed in panels
whatever the kernel choice, and its rows are gathered from them (`kernels.cpu.panel_rows`); where the
panel GEMM does not build it stays dense and unpacked. The memory plan (`mstarc explain`) counts one
copy: a rank's resident weights are the plan's weight bytes. `device_of(module)` is where a module's
tensors live (a packed linear's stand-in says "meta").

Results differ from MKL's in the last bits (another summation order), like any change of
GEMM kernel; every serving test runs on the packed path.

Compiled steps (runtime/model_executor/compiled' CPU compile) call the packed GEMM as the custom op
`mstar::packed_linear`: inductor's own lowering of the oneDNN op takes only weights it
froze itself (a copy per compiled graph), so the op stays one opaque call on the weight
packed here, once, shared by every batch bucket.
"""
from __future__ import annotations

import itertools
import os

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_executor.heap import TRIM_AFTER, release_freed_memory
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.parallel.quant import QuantWeight

PACK_BATCH_HINT = 16        # the row count oneDNN picks the packed layout for (decode batches)
_DTYPES = (torch.float32, torch.bfloat16)
KERNELS = ("auto", "mstar", "onednn", "torch")
# the panel GEMM's (panels, k, 16) or oneDNN's blocked copy (the weight's 2-D shape), or the quantized weight
Packed = torch.Tensor | QuantWeight


def onednn_available() -> bool:
    """oneDNN linear with packed weights is usable in this torch."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def bf16_packable() -> bool:
    """Whether oneDNN has bf16 GEMM kernels for this CPU."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def gemm_kernel(dtype: torch.dtype = torch.float32) -> str:
    """The packed GEMM this process uses for weights of `dtype`: "mstar", "onednn" or "torch" (module doc)."""
    choice = os.environ.get("MSTAR_CPU_LINEAR", "auto")
    if choice not in KERNELS:
        raise ValueError(f"MSTAR_CPU_LINEAR={choice!r}: choose one of {', '.join(KERNELS)}")
    if choice == "torch":
        return "torch"
    panel = cpu_kernels.status() == ""
    if choice == "mstar" and not panel:
        raise RuntimeError(f"MSTAR_CPU_LINEAR=mstar, but the CPU kernels are {cpu_kernels.status()}")
    if choice == "auto":
        amx_bf16 = dtype == torch.bfloat16 and _has_amx() and onednn_available()
        choice = "mstar" if panel and not amx_bf16 else "onednn"
    return choice if choice == "mstar" or onednn_available() else "torch"


def _has_amx() -> bool:
    return "amx_bf16" in cpu_kernels.cpu_flags().split()


def bf16_gemm_note() -> str | None:
    """What a bf16 model should be told on a CPU where its GEMMs run torch's generic kernel (None: they don't)."""
    kernel = gemm_kernel(torch.bfloat16)
    if kernel in ("mstar", "torch") or (kernel == "onednn" and bf16_packable()):
        return None
    return ("this CPU has no bf16 instructions oneDNN can use (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX): bf16 "
            "linears run through torch's generic kernel, several times slower than fp32 here; serve the fp32 "
            "weights for speed")


def pack_weight(weight: torch.Tensor, rows_read: bool = False) -> Packed | None:
    """The packed copy of a (out, in) weight for this process's GEMM kernel, or None where packing does not apply.
    The panel GEMM's copy is 3-D (panels, in, 16); oneDNN's keeps the weight's 2-D shape. `rows_read`: the
    weight is also read by rows (a tied embedding table): panels or nothing (module doc)."""
    if weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2 or weight.numel() == 0:
        return None
    kernel = gemm_kernel(weight.dtype)
    if kernel == "torch":
        return None
    if kernel == "mstar" or rows_read:
        return cpu_kernels.pack_panels(weight) if cpu_kernels.status() == "" else None
    if weight.dtype == torch.bfloat16 and not bf16_packable():
        return None
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_BATCH_HINT)


def pack_own_weight(module: nn.Module) -> int:
    """Pack `module.weight` into `module.packed`, the dense weight then gone (1), or leave it (0: it does not
    pack, or it is packed already)."""
    if module.weight.device.type == "meta":     # packed already: its packed copy is its only one
        return 0
    module.packed = pack_weight(module.weight)
    if module.packed is None:
        return 0
    module.weight = dense_gone(module.weight)
    return 1


def dense_gone(weight: torch.Tensor) -> nn.Parameter:
    """The stand-in for a weight whose one copy is now its packed one (module doc): same shape and dtype,
    on the meta device, so that any read of the dense weight fails instead of computing on nothing."""
    return nn.Parameter(torch.empty_like(weight, device="meta"), requires_grad=False)


def device_of(module: nn.Module) -> torch.device:
    """Where `module`'s tensors live (its first parameter or buffer not on the meta device; CPU for none)."""
    return next((t.device for t in itertools.chain(module.parameters(), module.buffers()) if t.device.type != "meta"),
                torch.device("cpu"))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: Packed | None) -> torch.Tensor:
    """F.linear(x, weight, bias), on the packed (or quantized) weight when there is one and x can use it."""
    if packed is None:
        return F.linear(x, weight, bias)
    if isinstance(packed, QuantWeight):
        y = packed.matmul(x)
        return y if bias is None else y + bias
    if x.device.type != "cpu" or x.dtype != packed.dtype:
        raise RuntimeError(f"a {x.dtype} input on {x.device} to a linear packed for {packed.dtype} on the CPU "
                           "(its packed copy is its only one)")
    if torch.compiler.is_compiling():
        return packed_linear(x, packed, bias, weight.shape[0])
    return _packed(x, packed, bias, weight.shape[0])


def _packed(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    if packed.dim() == 3:
        return cpu_kernels.gemm(x, packed, n, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@torch.library.custom_op("mstar::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """x (..., in) @ the packed (n, in) weight^T (+ bias): the packed GEMM as one opaque op (module doc)."""
    return _packed(x, packed, bias, n)


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))


class PackedLinear(nn.Module):
    """An `nn.Linear` with a packed weight: the same parameters (names and tensors)."""

    def __init__(self, source: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = source.in_features, source.out_features
        self.bias = source.bias
        self.packed = pack_weight(source.weight)
        self.weight = dense_gone(source.weight) if self.packed is not None else source.weight
        # the source gives its dense weight up too: a caller walking the old modules (pack_linears' list) would
        # otherwise keep every dense weight alive beside its packed copy until the walk ends (2x the weights)
        source.weight = self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


def pack_linears(root: nn.Module) -> int:
    """Pack every linear weight under `root` (in place); returns how many were packed.

    Modules that hold a linear weight under another name implement `pack_for_cpu()`
    (runtime.model_executor.parallel's column/row-parallel linears and LM head); plain `nn.Linear`
    children are swapped for `PackedLinear` around the same bias. A module packs once: its dense
    weight is gone after (`dense_gone`), so a second call finds nothing more to pack.
    """
    if gemm_kernel() == "torch":
        return 0
    owners: dict[int, int] = {}     # parameter -> modules holding it (a weight two modules hold stays dense)
    for module in root.modules(remove_duplicate=False):
        for p in module.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    count = 0
    for module in list(root.modules()):
        if callable(getattr(module, "pack_for_cpu", None)):
            count += module.pack_for_cpu()
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and owners[id(child.weight)] == 1 \
                    and (packed := PackedLinear(child)).packed is not None:
                setattr(module, name, packed)
                count += 1
                if packed.weight.nbytes >= TRIM_AFTER:    # its dense copy is freed: the pages go back (heap.py)
                    release_freed_memory()
    return count
