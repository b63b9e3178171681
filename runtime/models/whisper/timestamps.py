"""The rules a Whisper window's tokens follow when it is asked for timestamps (what transformers'
WhisperTimeStampLogitsProcessor and openai/whisper's ApplyTimestampRules enforce), applied to one row of
logits given the tokens the window wrote so far (after its prompt, language and task):

- <|notimestamps|> is never written;
- the first token is a timestamp, at most `max_initial` steps (0.02 s each) in;
- timestamps come in pairs: after a pair only text (or the end) may follow, after a lone timestamp
  only a timestamp or the end;
- timestamps never go back (a pair's closing one may equal its opening one, nothing else may repeat);
- when the timestamps together are likelier than the likeliest text token, a timestamp is written.
"""
from __future__ import annotations

from typing import Sequence

import torch

from runtime.models.whisper.tokens import WhisperTokens


def apply_timestamp_rules(logits: torch.Tensor, written: Sequence[int], tokens: WhisperTokens,
                          max_initial: int | None) -> torch.Tensor:
    """`logits` (vocab,) with the rules applied (a new tensor)."""
    out = logits.clone()
    begin = tokens.first_timestamp
    out[tokens.no_timestamps] = float("-inf")
    last_is_time = len(written) >= 1 and written[-1] >= begin
    before_last_is_time = len(written) < 2 or written[-2] >= begin
    if last_is_time:
        if before_last_is_time:
            out[begin:] = float("-inf")
        else:
            out[:tokens.eot] = float("-inf")
    times = [t for t in written if t >= begin]
    if times:
        floor = times[-1] if last_is_time and not before_last_is_time else times[-1] + 1
        out[begin:floor] = float("-inf")
    if not written:
        out[:begin] = float("-inf")
        if max_initial is not None:
            out[begin + max_initial + 1:] = float("-inf")
    logprobs = torch.log_softmax(out.float(), dim=-1)
    if logprobs[begin:].logsumexp(dim=-1) > logprobs[:begin].max():
        out[:begin] = float("-inf")
    return out
