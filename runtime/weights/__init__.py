"""Weights: HF-named tensor slots with a checked loader, seeded random weights, safetensors reading."""
from __future__ import annotations

from runtime.weights.safetensors_loader import iter_safetensors, load_safetensors
from runtime.weights.slots import Slot, WeightLoadError, load_into, random_tensors

__all__ = ["Slot", "WeightLoadError", "iter_safetensors", "load_into", "load_safetensors", "random_tensors"]
