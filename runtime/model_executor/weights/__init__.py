"""Weights: HF-named tensor slots with a checked loader, seeded random weights, safetensors reading,
published repositories read through the graph's mapping (sources, repository, mapping, match, published)."""
from __future__ import annotations

from runtime.model_executor.weights.published import ConfigMismatch, WeightMismatch
from runtime.model_executor.weights.repository import RepositoryError
from runtime.model_executor.weights.safetensors_loader import iter_safetensors, load_safetensors
from runtime.model_executor.weights.slots import Slot, WeightLoadError, load_into, random_tensors
from runtime.model_executor.weights.sources import MissingWeights

# what a start-up with the wrong weights raises: printed for people, exit status 2
WEIGHT_ERRORS = (MissingWeights, ConfigMismatch, WeightMismatch, RepositoryError, WeightLoadError)

__all__ = ["WEIGHT_ERRORS", "ConfigMismatch", "MissingWeights", "RepositoryError", "Slot", "WeightLoadError",
           "WeightMismatch", "iter_safetensors", "load_into", "load_safetensors", "random_tensors"]
