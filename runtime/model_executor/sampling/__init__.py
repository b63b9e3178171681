"""Turning logits into tokens, per request: params, per-request state, the batched sampler, stops, grammars."""
from __future__ import annotations

from runtime.model_executor.sampling.grammar import GrammarError, GrammarVocab, check_grammar
from runtime.model_executor.sampling.params import SamplingParams, SamplingParamsError
from runtime.model_executor.sampling.sampler import Sampler, SamplerOutput
from runtime.model_executor.sampling.state import SamplingState
from runtime.model_executor.sampling.stop import StopStringMatcher, stop_token_ids

__all__ = [
    "GrammarError",
    "GrammarVocab",
    "Sampler",
    "SamplerOutput",
    "SamplingParams",
    "SamplingParamsError",
    "SamplingState",
    "StopStringMatcher",
    "check_grammar",
    "stop_token_ids",
]
