"""Weights of Qwen3-Omni's components: plain-module slots, shared decoder slots, initialisation.

The published checkpoint is one safetensors set for the whole model; which of its tensors each
component reads (`code2wav.`, `talker.` without `talker.code_predictor.`, `thinker.audio_tower.`,
`thinker.visual.`) and with which prefix stripped is the graph's `weights:` mapping, applied by
`runtime.model_executor.weights`. A component's slot names are the checkpoint names relative to it.

Components whose parameters *are* the checkpoint tensors (code2wav, the encoders) get
their slots from `parameter_slots`; the talker and code predictor, which fuse q/k/v and
gate/up through the shared decoder layers, describe theirs by hand. Either way
`initialise` loads `args["weights"]` when given, else seeded random tensors.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from runtime.model_executor.weights import Slot, iter_safetensors, load_into, random_tensors
from runtime.model_executor.weights.slots import parameter_slots


def decoder_slots(layers: nn.ModuleList, config: Any, plain: Mapping[str, nn.Module]) -> dict[str, Slot]:
    """Slots of `model.layers.*` (shared DecoderLayer weights) plus plain modules by HF prefix."""
    slots = {f"model.layers.{i}.{k}": v for i, layer in enumerate(layers) for k, v in layer.slots("", config).items()}
    for prefix, module in plain.items():
        slots.update({f"{prefix}.{k}": v for k, v in parameter_slots(module).items()})
    return slots


def initialise(slots: Mapping[str, Slot], args: Mapping[str, Any]) -> None:
    """Load `args["weights"]` (safetensors holding exactly this component's tensors, named as its
    slots) or seeded random weights (`args["seed"]`, default 0)."""
    if args.get("weights"):
        load_into(slots, iter_safetensors(args["weights"]))
    else:
        load_into(slots, random_tensors(slots, int(args.get("seed", 0))))


class CheckpointWeights:
    """Mixin of the Qwen3-Omni components: HF-named slots and the checked loader over them."""

    def hf_slots(self) -> dict[str, Slot]:
        """Checkpoint name (relative to the component) -> slot, for every tensor this component reads."""
        assert isinstance(self, nn.Module)
        return parameter_slots(self)

    def load_hf_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Load checkpoint-named tensors (relative names); raises WeightLoadError on any mismatch."""
        load_into(self.hf_slots(), tensors)
