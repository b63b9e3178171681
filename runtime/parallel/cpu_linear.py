"""Linear layers on CPU through oneDNN, with each weight packed once after loading.

torch's fp32 `F.linear` on CPU calls MKL's sgemm, which runs decode-sized GEMMs
(16 x 576 x 1728) far below oneDNN's speed with a weight reordered once into its blocked
layout (the op torch's own compiler uses after freezing). `python tools/bench.py linear`
measures the two on the same weights; the README's benchmark table holds the figures.

`pack_linears(module)` runs after a rank's weights are loaded (runtime.worker.loader):
every linear of the module tree on CPU keeps its dense weight (state_dict, tied
embeddings and weight loading are unchanged) and gains a packed copy that its forward
uses. The packed copy costs the weight's size again in host memory. It is skipped where
oneDNN is missing, for other devices and dtypes, and when MSTAR_CPU_LINEAR=torch.

Results differ from MKL's in the last bits (another summation order), like any change of
GEMM kernel; every serving test runs on the packed path.

Compiled steps (runtime/cuda_graphs' CPU compile) call the packed GEMM as the custom op
`mstar::packed_linear`: inductor's own lowering of the oneDNN op takes only weights it
froze itself (a copy per compiled graph), so the op stays one opaque call on the weight
packed here, once, shared by every batch bucket.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

PACK_BATCH_HINT = 16        # the row count oneDNN picks the packed layout for (decode batches)
_DTYPES = (torch.float32, torch.bfloat16)


def onednn_available() -> bool:
    """oneDNN linear with packed weights is usable here (and not switched off)."""
    if os.environ.get("MSTAR_CPU_LINEAR", "onednn") == "torch":
        return False
    ops = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and ops is not None
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The oneDNN-packed copy of a (out, in) weight, or None where packing does not apply."""
    if weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2 or weight.numel() == 0:
        return None
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_BATCH_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           packed: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias), on the packed weight when there is one and x can use it."""
    if packed is None or x.device.type != "cpu" or x.dtype != packed.dtype:
        return F.linear(x, weight, bias)
    if torch.compiler.is_compiling():
        return packed_linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@torch.library.custom_op("mstar::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., in) @ packed (out, in) weight^T (+ bias): the oneDNN GEMM as one opaque op (module doc)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _packed_linear_shape(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


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
    (runtime.parallel's column/row-parallel linears and LM head); plain `nn.Linear`
    children are swapped for `PackedLinear` around the same parameters.
    """
    if not onednn_available():
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
