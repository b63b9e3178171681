"""OpenAI's `logprobs` / `top_logprobs` chat fields: read from a body, written into answers.

A request that sets `logprobs: true` (and optionally `top_logprobs: N`, 0..20) gets, per
answer token, the log-probability the model gave it and its N most likely alternatives
(the sampler's raw distribution, before temperature and penalties, as OpenAI reports
them): `choices[0].logprobs.content` when not streamed, each chunk's `logprobs.content`
for the tokens of that chunk when streamed. Stop tokens add no text and no entry.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from runtime.model_executor.sampling.params import MAX_TOP_LOGPROBS
from runtime.entrypoints.http.errors import ApiError
from runtime.text.tokenizer import TextTokenizer
from runtime.transport.messages import TokenLogprob


def requested_logprobs(body: Mapping[str, Any]) -> int | None:
    """SamplingParams.logprobs for a chat body: None (not asked) or how many alternatives; 400 if ill-formed."""
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise ApiError(400, f"'logprobs' must be a boolean, got {asked!r}", "logprobs")
    if not asked:
        if top is not None:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return None
    if top is None:
        return 0
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"'top_logprobs' must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}",
                       "top_logprobs")
    return top


class LogprobsContent:
    """The `logprobs.content` entries of one answer, built as its tokens arrive."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.pending: list[dict[str, Any]] = []     # entries not yet sent (streaming takes them per chunk)

    def add(self, token_id: int, logprob: TokenLogprob) -> None:
        entry = self._token(token_id, logprob.logprob)
        entry["top_logprobs"] = [self._token(i, lp) for i, lp in zip(logprob.top_ids, logprob.top_logprobs)]
        self.pending.append(entry)

    def take(self) -> dict[str, Any]:
        """`{"content": [...], "refusal": None}` of the entries added since the last take."""
        content, self.pending = self.pending, []
        return {"content": content, "refusal": None}

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def missing_logprobs(token_ids: Sequence[int], logprobs: Sequence[TokenLogprob]) -> str | None:
    """Why an event of a request that asked for logprobs cannot be answered with them, or None."""
    if token_ids and len(logprobs) != len(token_ids):
        return (f"{len(token_ids)} tokens came with {len(logprobs)} logprobs: the node that sampled them "
                "does not report logprobs")
    return None
