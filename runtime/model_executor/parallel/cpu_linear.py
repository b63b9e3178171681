"""Linear layers on CPU with each weight packed once after loading, for one of two GEMM kernels.

torch's fp32 `F.linear` on CPU calls MKL's sgemm, which runs decode-sized GEMMs (16 x 576 x
1728) far below what a kernel reading a weight laid out for it does. Two such kernels, chosen
per process and weight dtype by `gemm_kernel(dtype)` (`MSTAR_CPU_LINEAR`: auto, mstar, onednn or torch;
`auto` may also take both by row count, "split"):

* "mstar": runtime/model_executor/kernels/cpu.cpp's panel GEMM (weights in 16-column k-major panels, register
  blocks of rows over one to three panels by the CPU's vector width and the batch's row count, each
  output one in-order sum over k, whatever the batch; bf16 through AVX512-BF16's `vdpbf16ps` where the
  CPU has it). It takes bf16 weights on any CPU (without bf16 instructions: converted to
  fp32 in registers). `auto` picks it wherever it builds (for bf16 weights on CPUs with AMX: "split"):
  on every CPU measured it ran SmolLM2's decode GEMMs faster than oneDNN, in fp32 and bf16 alike, except
  bf16 on AMX, where oneDNN's tile kernels lead above `AMX_PANEL_ROWS` rows.
* "onednn": oneDNN with the weight reordered into its blocked layout (the op torch's own
  compiler uses after freezing). bf16 needs oneDNN's bf16 kernels for the CPU (AVX-512 BW/VL/DQ,
  AVX-NE-CONVERT or AMX); without them bf16 weights stay unpacked.
* "split" (`auto`'s choice for bf16 weights on AMX CPUs, not a setting): both copies, the panel GEMM for
  calls of at most `AMX_PANEL_ROWS` rows and oneDNN's tile kernels above, the row count where the two
  crossed on a Sapphire Rapids Xeon (a decode layer's GEMMs, weights streamed from DRAM).
  It costs the weight's size a second time in host memory (`MSTAR_CPU_LINEAR=onednn`: one packed copy). The cut
  was measured before the panel GEMM's 8 x 3 blocks, which may move it up; not re-measured on an AMX machine.
* "torch": nothing packed, `F.linear` (also where neither kernel is available).

`python tools/bench.py linear` measures the chosen kernel against F.linear on the same
weights and `python tools/bench.py kernels` the two kernels against each other; the figures are in
docs/benchmark-log.md.

`pack_linears(module)` runs after a rank's weights are loaded (runtime.worker.loader):
every linear of the module tree on CPU keeps its dense weight (state_dict, tied
embeddings and weight loading are unchanged) and gains a packed copy that its forward
uses. The packed copy costs the weight's size again in host memory. It is skipped for
other devices and dtypes.

Results differ from MKL's in the last bits (another summation order), like any change of
GEMM kernel; every serving test runs on the packed path.

Compiled steps (runtime/model_executor/compiled' CPU compile) call the packed GEMM as the custom op
`mstar::packed_linear`: inductor's own lowering of the oneDNN op takes only weights it
froze itself (a copy per compiled graph), so the op stays one opaque call on the weight
packed here, once, shared by every batch bucket.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from runtime.model_executor.kernels import cpu as cpu_kernels

PACK_BATCH_HINT = 16        # the row count oneDNN picks the packed layout for (decode batches)
AMX_PANEL_ROWS = 10         # "split": the panel GEMM up to this many rows, oneDNN's AMX kernels above (module doc)
_DTYPES = (torch.float32, torch.bfloat16)
KERNELS = ("auto", "mstar", "onednn", "torch")
Packed = torch.Tensor | tuple[torch.Tensor, torch.Tensor]    # one packed copy, or "split"'s (panel, oneDNN)


def onednn_available() -> bool:
    """oneDNN linear with packed weights is usable in this torch."""
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def bf16_packable() -> bool:
    """Whether oneDNN has bf16 GEMM kernels for this CPU."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def gemm_kernel(dtype: torch.dtype = torch.float32) -> str:
    """The packed GEMM this process uses for weights of `dtype`: "mstar", "onednn", "split" or "torch" (module doc)."""
    choice = os.environ.get("MSTAR_CPU_LINEAR", "auto")
    if choice not in KERNELS:
        raise ValueError(f"MSTAR_CPU_LINEAR={choice!r}: choose one of {', '.join(KERNELS)}")
    if choice == "torch":
        return "torch"
    panel = cpu_kernels.status() == ""
    if choice == "auto":
        choice = ("split" if dtype == torch.bfloat16 and _has_amx() else "mstar") if panel else "onednn"
    if choice == "mstar":
        if not panel:
            raise RuntimeError(f"MSTAR_CPU_LINEAR=mstar, but the CPU kernels are {cpu_kernels.status()}")
        return choice
    if not onednn_available():
        return "mstar" if choice == "split" else "torch"
    return choice


def _has_amx() -> bool:
    return "amx_bf16" in cpu_kernels.cpu_flags().split()


def bf16_gemm_note() -> str | None:
    """What a bf16 model should be told on a CPU where its GEMMs run torch's generic kernel (None: they don't)."""
    kernel = gemm_kernel(torch.bfloat16)
    if kernel in ("mstar", "split", "torch") or (kernel == "onednn" and bf16_packable()):
        return None
    return ("this CPU has no bf16 instructions oneDNN can use (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX): bf16 "
            "linears run through torch's generic kernel, several times slower than fp32 here; serve the fp32 "
            "weights for speed")


def pack_weight(weight: torch.Tensor) -> Packed | None:
    """The packed copy of a (out, in) weight for this process's GEMM kernel, or None where packing does not apply.
    The panel GEMM's copy is 3-D (panels, in, 16); oneDNN's keeps the weight's 2-D shape; "split" gives both
    (panel, oneDNN)."""
    if weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2 or weight.numel() == 0:
        return None
    kernel = gemm_kernel(weight.dtype)
    if kernel == "mstar":
        return cpu_kernels.pack_panels(weight)
    if kernel == "torch" or (weight.dtype == torch.bfloat16 and not bf16_packable()):
        return None
    with torch.no_grad():
        onednn = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_BATCH_HINT)
    return (cpu_kernels.pack_panels(weight), onednn) if kernel == "split" else onednn


def _for_rows(packed: Packed, x: torch.Tensor) -> torch.Tensor:
    """The packed copy that runs `x`: a "split" pair's panel copy for at most AMX_PANEL_ROWS rows, else its oneDNN one."""
    if isinstance(packed, torch.Tensor):
        return packed
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return packed[0] if rows <= AMX_PANEL_ROWS else packed[1]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: Packed | None) -> torch.Tensor:
    """F.linear(x, weight, bias), on the packed weight when there is one and x can use it."""
    if packed is None or x.device.type != "cpu":
        return F.linear(x, weight, bias)
    packed = _for_rows(packed, x)      # under torch.compile: chosen at trace time, each bucket's rows are fixed
    if x.dtype != packed.dtype:
        return F.linear(x, weight, bias)
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
        self.weight, self.bias = source.weight, source.bias
        self.packed = pack_weight(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


def pack_linears(root: nn.Module) -> int:
    """Pack every linear weight under `root` (in place); returns how many were packed.

    Modules that hold a linear weight under another name implement `pack_for_cpu()`
    (runtime.model_executor.parallel's column/row-parallel linears and LM head); plain `nn.Linear`
    children are swapped for `PackedLinear` around the same parameters.
    """
    if gemm_kernel() == "torch":
        return 0
    count = 0
    for module in list(root.modules()):
        if callable(getattr(module, "pack_for_cpu", None)):
            count += module.pack_for_cpu()
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and (packed := PackedLinear(child)).packed is not None:
                setattr(module, name, packed)
                count += 1
    return count
