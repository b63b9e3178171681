"""Weights of Qwen3-Omni's components: checkpoint prefixes, plain-module slots, initialisation.

The published checkpoint is one safetensors set for the whole model; each component reads
the tensors under its own prefix (`code2wav.`, `talker.`, `talker.code_predictor.`,
`thinker.audio_tower.`, `thinker.visual.`) with the prefix stripped, so a component's slot
names are the checkpoint names relative to it. `iter_prefixed` opens only those tensors,
never the rest of the 35B-parameter checkpoint.

Components whose parameters *are* the checkpoint tensors (code2wav, the encoders) get
their slots from `parameter_slots`; the talker and code predictor, which fuse q/k/v and
gate/up through the shared decoder layers, describe theirs by hand. Either way
`initialise` loads `args["weights"]` when given, else seeded random tensors.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import torch
from safetensors import safe_open
from torch import nn

from runtime.weights import Slot, load_into, random_tensors
from runtime.weights.slots import parameter_slots
from runtime.weights.safetensors_loader import checkpoint_files

def iter_prefixed(path: str | Path, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name without `prefix`, tensor) for every checkpoint tensor under `prefix`, read lazily."""
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as reader:
            for name in reader.keys():
                if name.startswith(prefix):
                    yield name[len(prefix):], reader.get_tensor(name)


def decoder_slots(layers: nn.ModuleList, config: Any, plain: Mapping[str, nn.Module]) -> dict[str, Slot]:
    """Slots of `model.layers.*` (shared DecoderLayer weights) plus plain modules by HF prefix."""
    slots = {f"model.layers.{i}.{k}": v for i, layer in enumerate(layers) for k, v in layer.slots("", config).items()}
    for prefix, module in plain.items():
        slots.update({f"{prefix}.{k}": v for k, v in parameter_slots(module).items()})
    return slots


def initialise(slots: Mapping[str, Slot], args: Mapping[str, Any], prefix: str) -> None:
    """Load `args["weights"]` (the whole model's checkpoint; tensors under `prefix`) or
    seeded random weights (`args["seed"]`, default 0)."""
    if args.get("weights"):
        load_into(slots, iter_prefixed(args["weights"], prefix))
    else:
        load_into(slots, random_tensors(slots, int(args.get("seed", 0))))


class CheckpointWeights:
    """Mixin of the Qwen3-Omni components: HF-named slots and the checked loader over them."""

    hf_prefix: str = ""  # where the published checkpoint keeps this component's tensors

    def hf_slots(self) -> dict[str, Slot]:
        """Checkpoint name (prefix stripped) -> slot, for every tensor this component reads."""
        assert isinstance(self, nn.Module)
        return parameter_slots(self)

    def load_hf_state_dict(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Load checkpoint-named tensors (prefix stripped); raises WeightLoadError on any mismatch."""
        load_into(self.hf_slots(), tensors)
