"""When a request stops: stop tokens (EOS and `stop_token_ids`) and stop strings.

Stop strings are matched on detokenised text, not on token ids, because one string can
be spelt by many token sequences. `StopStringMatcher` sits between the incremental
detokeniser and the client: it holds back any tail that could be the start of a stop
string, so the client never sees a stop string or a piece of one, and on a match it
returns the text before the match (the matched string itself is trimmed).
"""
from __future__ import annotations

from typing import Iterable, Sequence

from runtime.model_executor.sampling.params import SamplingParams


def stop_token_ids(params: SamplingParams, eos_token_ids: Iterable[int]) -> frozenset[int]:
    """The token ids that end this request: the model's EOS ids (unless ignore_eos) + its own."""
    eos = () if params.ignore_eos else tuple(eos_token_ids)
    return frozenset((*eos, *params.stop_token_ids))


class StopStringMatcher:
    """Finds the first stop string in streamed text; never emits any part of one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._held = ""          # tail of the text so far that is a proper prefix of some stop string
        self.matched: str | None = None

    def push(self, delta: str) -> tuple[str, bool]:
        """Add new text; returns (text safe to emit now, whether a stop string matched)."""
        if self.matched is not None:
            return "", True
        text = self._held + delta
        hit = self._first_match(text)
        if hit is not None:
            start, self.matched = hit
            self._held = ""
            return text[:start], True
        hold = self._held_tail_length(text)
        self._held = text[len(text) - hold:] if hold else ""
        return text[:len(text) - hold], False

    def flush(self) -> str:
        """The held-back tail, released when the request ends without a match."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        hits = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        return min(hits, default=None)

    def _held_tail_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
