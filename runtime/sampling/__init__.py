"""Turning logits into tokens, per request: params, per-request state, the batched sampler, stops."""
from __future__ import annotations

from runtime.sampling.params import SamplingParams, SamplingParamsError
from runtime.sampling.sampler import Sampler, SamplerOutput
from runtime.sampling.state import SamplingState
from runtime.sampling.stop import StopStringMatcher, stop_token_ids

__all__ = [
    "Sampler",
    "SamplerOutput",
    "SamplingParams",
    "SamplingParamsError",
    "SamplingState",
    "StopStringMatcher",
    "stop_token_ids",
]
