"""`TextOutput`: one request's generated token ids -> the text its client receives.

The one way output text is decoded: every handler that answers text (chat, transcriptions,
chat answered in speech, realtime sessions, /v1/tasks) goes through a `TextOutput` (`push` per
token, `push_ids` per output event, `output_text` for a finished request), never through the
tokenizer or the incremental detokeniser (runtime/text/detokenizer.py) directly.

Joins the incremental detokeniser with the request's stop rules and reports when the request
must end. Stop tokens end the request without adding their own text; a stop string ends
it with the text up to (not including) the match, and no part of a stop string ever
reaches the client.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from runtime.model_executor.sampling.params import SamplingParams
from runtime.model_executor.sampling.stop import StopStringMatcher, stop_token_ids
from runtime.text.detokenizer import IncrementalDetokenizer
from runtime.text.tokenizer import TextTokenizer


@dataclass(frozen=True)
class TextOutputDelta:
    """What one token changed for the client."""

    text: str                          # new text to send ("" while a character or stop string is pending)
    finished: bool = False             # a stop token or stop string ended the request
    stop_reason: int | str | None = None   # the stop token id or the matched stop string


class TextOutput:
    """Per-request text output with stop tokens and stop strings applied."""

    def __init__(self, tokenizer: TextTokenizer, params: SamplingParams, prompt_ids: Sequence[int] = (), *,
                 stop_ids: frozenset[int] | None = None, skip_special_tokens: bool = True) -> None:
        """`stop_ids`: the ids the request stops at (the server passes the set the conductor stops
        on); by default `stop_token_ids(params, tokenizer.eos_token_ids)`."""
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
        self._stops = StopStringMatcher(params.stop)
        self._stop_ids = stop_token_ids(params, tokenizer.eos_token_ids) if stop_ids is None else stop_ids
        self.finished = False

    def push(self, token_id: int) -> TextOutputDelta:
        """Feed one generated token (do not push after `finished`)."""
        if self.finished:
            raise RuntimeError("TextOutput.push after the request finished")
        if token_id in self._stop_ids:
            self.finished = True
            text, matched = self._stops.push(self._detokenizer.flush())
            if matched:
                return TextOutputDelta(text, True, self._stops.matched)
            return TextOutputDelta(text + self._stops.flush(), True, int(token_id))
        text, matched = self._stops.push(self._detokenizer.push(token_id))
        self.finished = matched
        return TextOutputDelta(text, matched, self._stops.matched if matched else None)

    def push_ids(self, token_ids: Iterable[int], *, is_last: bool = False) -> str:
        """The text an output event's ids add (ids after a stop add none); with `is_last`, the
        held-back text too. For callers that need no per-token stop reason."""
        text = ""
        for token_id in token_ids:
            if self.finished:
                break
            text += self.push(token_id).text
        return text + self.finish() if is_last else text

    def finish(self) -> str:
        """The held-back text when the request ends for another reason (max tokens, abort)."""
        if self.finished:
            return ""
        self.finished = True
        text, matched = self._stops.push(self._detokenizer.flush())
        return text if matched else text + self._stops.flush()


def output_text(tokenizer: TextTokenizer, token_ids: Sequence[int], stop_ids: frozenset[int]) -> str:
    """A finished request's whole text: what the pushes of one `TextOutput` add up to."""
    return TextOutput(tokenizer, SamplingParams(), stop_ids=stop_ids).push_ids(token_ids, is_last=True)
