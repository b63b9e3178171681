"""`SamplingParams`: how one request turns logits into tokens, checked on construction.

The server builds one from a request body (OpenAI field names where OpenAI has them);
every out-of-range or ill-typed value raises `SamplingParamsError` naming the field, which
the server answers with HTTP 400. The conductor hands the params to `SamplingState` (one
per request) and the `Sampler` reads them row by row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

MAX_TOP_LOGPROBS = 20          # OpenAI's limit on `top_logprobs`
MAX_STOP_STRINGS = 16
_SEED_RANGE = (-(2**63), 2**64 - 1)   # what torch.Generator.manual_seed accepts


class SamplingParamsError(ValueError):
    """A request's sampling field is invalid; `field` names it (HTTP 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings. Defaults sample from the model's distribution unchanged."""

    temperature: float = 1.0          # [0, 2] as OpenAI; 0 = greedy (argmax), else logits / temperature
    top_k: int = 0                    # keep the k most likely tokens; 0 (or -1) = off
    top_p: float = 1.0                # keep the smallest prefix with cumulative probability >= top_p; (0, 1]
    min_p: float = 0.0                # drop tokens with p < min_p * p_max; [0, 1]
    repetition_penalty: float = 1.0   # CTRL-style, over prompt + output tokens; > 0, 1 = off
    presence_penalty: float = 0.0     # OpenAI: subtract once per token seen in the output; [-2, 2]
    frequency_penalty: float = 0.0    # OpenAI: subtract per occurrence in the output; [-2, 2]
    seed: int | None = None           # same seed + same logits -> same tokens, whatever the batch
    stop: tuple[str, ...] = ()        # stop strings, matched on detokenised text, trimmed from output
    stop_token_ids: tuple[int, ...] = ()  # extra stop tokens besides the model's EOS
    ignore_eos: bool = False          # keep going past EOS (benchmarks: forced lengths)
    logprobs: int | None = None       # None: no logprobs; N >= 0: chosen token's + top-N alternatives

    def __post_init__(self) -> None:
        _check_number(self, "temperature", 0.0, 2.0)
        _check_int(self, "top_k", -1, None)
        _check_number(self, "top_p", 0.0, 1.0, low_open=True)
        _check_number(self, "min_p", 0.0, 1.0)
        _check_number(self, "repetition_penalty", 0.0, 100.0, low_open=True)
        _check_number(self, "presence_penalty", -2.0, 2.0)
        _check_number(self, "frequency_penalty", -2.0, 2.0)
        if self.seed is not None:
            _check_int(self, "seed", *_SEED_RANGE)
        self._check_stops()
        if not isinstance(self.ignore_eos, bool):
            raise SamplingParamsError("ignore_eos", f"must be a boolean, got {self.ignore_eos!r}")
        if self.logprobs is not None:
            _check_int(self, "logprobs", 0, MAX_TOP_LOGPROBS)

    def _check_stops(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", stop)
        if len(stop) > MAX_STOP_STRINGS:
            raise SamplingParamsError("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
        for s in stop:
            if not isinstance(s, str) or not s:
                raise SamplingParamsError("stop", f"stop strings must be non-empty strings, got {s!r}")
        ids = tuple(self.stop_token_ids)
        object.__setattr__(self, "stop_token_ids", ids)
        for i in ids:
            if not _is_int(i) or i < 0:
                raise SamplingParamsError("stop_token_ids", f"token ids must be integers >= 0, got {i!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def effective_top_k(self) -> int:
        """top_k with both spellings of "off" (0, -1) mapped to 0."""
        return max(self.top_k, 0)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SamplingParams:
        """Build from a request body's fields; unknown keys are an error, None means default."""
        known = {f.name for f in fields(cls)}
        for key in values:
            if key not in known:
                raise SamplingParamsError(str(key), f"unknown sampling field; known: {', '.join(sorted(known))}")
        return cls(**{k: v for k, v in values.items() if v is not None})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(params: SamplingParams, name: str, low: int, high: int | None) -> None:
    value = getattr(params, name)
    if not _is_int(value):
        raise SamplingParamsError(name, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise SamplingParamsError(name, f"must be {bound}, got {value}")


def _check_number(params: SamplingParams, name: str, low: float, high: float, *,
                  low_open: bool = False) -> None:
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SamplingParamsError(name, f"must be a number, got {value!r}")
    too_low = value <= low if low_open else value < low
    if not math.isfinite(value) or too_low or value > high:
        bracket = "(" if low_open else "["
        raise SamplingParamsError(name, f"must be in {bracket}{low}, {high}], got {value}")
    object.__setattr__(params, name, float(value))
