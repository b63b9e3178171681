"""Each side's prefix cache over one measured run, as the side itself reports it, and the rule that a
row only compares sides whose caches were in the same state.

A comparison runs in one named mode:
  cold  every prompt new (a nonce first in each request of each round: bench.chat_prompts) and prefix
        caching off on every side (mstar `--no-prefix-cache`, vLLM `--no-enable-prefix-caching`,
        llama.cpp `cache_prompt: false` per request and no host-memory prompt cache); every side must
        report its cache off and no prompt token reused, in every round.
  warm  caching on on every side, each round sending the prompts the unrecorded length check sent first;
        every side must report its cache on. How many prompt tokens each reused is recorded, not required
        to match: each reuses whole cache blocks of its own size (mstar 16 tokens, vLLM's CPU build 128,
        llama.cpp any prefix), so a prompt shorter than a side's block is computed again there.

The numbers come from each side's own counters: mstar's /metrics `mstar_prefix_cache_{query,hit}_tokens`,
vLLM's /metrics `vllm:prefix_cache_{queries,hits}` (tokens) and its start-up log's `enable_prefix_caching=`,
llama.cpp's /metrics `llamacpp:prompt_tokens{,_cached}_total`. `require_same` refuses (raises
`CacheMismatch`) a row whose sides differ; the suite records the refusal where its row would have been.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from bench.registry import Needs

COLD, WARM = "cold", "warm"
MODES = (COLD, WARM)
EXPECTED = {COLD: "off", WARM: "on"}      # the state every side must be in, per mode
CACHE_METRICS = ("cache_query_tokens", "cache_hit_tokens")   # the keys a measured run adds to its metrics


class CacheMismatch(Needs):
    """The sides of a row ran with their prefix caches in different states: the row is not published."""


@dataclass(frozen=True)
class CacheState:
    """One side's prefix cache over one measured run."""

    is_enabled: bool       # the cache is on, as the side says (mstar's /v1/models, vLLM's start-up log, llama.cpp's flags)
    query_tokens: int      # prompt tokens the side looked up in its cache during the run (its own counter)
    hit_tokens: int        # of those, the tokens it reused instead of computing them
    source: str            # which counter or log said so

    @property
    def word(self) -> str:
        """on (enabled), off (disabled, nothing reused), or off-but-hit (disabled by its own account, yet its
        counters say it reused tokens: never a mode's state)."""
        if self.is_enabled:
            return "on"
        return "off" if self.hit_tokens == 0 else "off-but-hit"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.word}

    def describe(self) -> str:
        return f"{self.word} ({self.hit_tokens} of {self.query_tokens} prompt tokens reused; {self.source})"


def from_samples(is_enabled: bool, source: str, samples: Mapping[str, Sequence[float]]) -> list[CacheState]:
    """One side's `CacheState` per recorded round from its samples' CACHE_METRICS."""
    queries, hits = (samples[key] for key in CACHE_METRICS)
    return [CacheState(is_enabled, int(q), int(h), source) for q, h in zip(queries, hits)]


def side_states(records: Mapping[str, Mapping[str, Any]], samples: Mapping[str, Mapping[str, Sequence[float]]],
                settings: dict[str, Any]) -> dict[str, list[CacheState]]:
    """Each side's `CacheState` per round, from its record's `cache_enabled` / `cache_source` and its samples;
    recorded in the run's `settings` as `cache_states`."""
    states = {name: from_samples(r["cache_enabled"], r["cache_source"], samples[name]) for name, r in records.items()}
    settings["cache_states"] = {name: [s.to_dict() for s in st] for name, st in states.items()}
    return states


def reuse_note(states: Mapping[str, Sequence[CacheState]]) -> str:
    """What each side reused over its rounds, for a warm row's note: "mstar reused 240 of 480 prompt tokens"."""
    return "; ".join(f"{name} reused {sum(s.hit_tokens for s in st)} of {sum(s.query_tokens for s in st)} prompt "
                     f"tokens" for name, st in states.items())


def require_same(case: str, mode: str, states: Mapping[str, Sequence[CacheState]]) -> None:
    """Raise `CacheMismatch` unless, in every round, every side's cache was in the state `mode` asks for
    (so the sides were in the same state as each other)."""
    if mode not in EXPECTED:
        raise ValueError(f"cache mode must be one of {MODES}, got {mode!r}")
    rounds = {len(s) for s in states.values()}
    if len(rounds) != 1:
        raise CacheMismatch(f"{case}: the sides recorded different numbers of rounds of cache state: "
                            f"{ {name: len(s) for name, s in states.items()} }")
    for i in range(rounds.pop()):
        words = {name: s[i].word for name, s in states.items()}
        if set(words.values()) != {EXPECTED[mode]}:
            said = "; ".join(f"{name} {s[i].describe()}" for name, s in states.items())
            raise CacheMismatch(f"{case}, round {i + 1}: {mode} rows need every side's prefix cache "
                                f"{EXPECTED[mode]}, but: {said}")
