"""A plain module's weights from its node's args: the safetensors file or directory `args["weights"]` names
(tensors named as the module's parameters, every one checked), else seeded random tensors (`args["seed"]`).
For modules whose parameter names are their checkpoint's; one read through a published mapping is filled
by the worker's loader instead (runtime/model_executor/weights/published.py)."""
from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from runtime.model_executor.weights.safetensors_loader import iter_safetensors
from runtime.model_executor.weights.slots import Slot, load_into, parameter_slots, random_tensors


def fill_weights(module: nn.Module, args: Mapping[str, Any], slots: Mapping[str, Slot] | None = None) -> None:
    """Load or draw every parameter of `module` (`slots`: what a checkpoint holds for it, its parameters by
    default); raises WeightLoadError naming every missing, unexpected or mis-shaped tensor."""
    if args.get("weights"):
        load_into(slots if slots is not None else parameter_slots(module), iter_safetensors(str(args["weights"])))
        return
    own = parameter_slots(module)
    load_into(own, random_tensors(own, int(args.get("seed", 0))))
