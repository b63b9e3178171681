"""OpenAI's `logprobs` / `top_logprobs` fields read from a chat body, and the entries written back."""
from __future__ import annotations

import pytest

from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.logprobs import LogprobsContent, missing_logprobs, requested_logprobs
from runtime.text import ByteTokenizer
from runtime.transport.messages import TokenLogprob


@pytest.mark.parametrize("body, want", [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0),
                                        ({"logprobs": True, "top_logprobs": 20}, 20)])
def test_asked_alternatives(body, want) -> None:
    assert requested_logprobs(body) == want


@pytest.mark.parametrize("body, field", [({"logprobs": 1}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
                                         ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                                         ({"logprobs": True, "top_logprobs": True}, "top_logprobs")])
def test_ill_formed_fields_are_400_naming_them(body, field) -> None:
    with pytest.raises(ApiError) as info:
        requested_logprobs(body)
    assert info.value.status == 400 and info.value.param == field


def test_entries_carry_token_text_bytes_and_alternatives() -> None:
    content = LogprobsContent(ByteTokenizer())
    content.add(ord("h"), TokenLogprob(-0.5, [ord("h"), ord("a")], [-0.5, -1.5]))
    assert content.take() == {"refusal": None, "content": [{
        "token": "h", "logprob": -0.5, "bytes": [104],
        "top_logprobs": [{"token": "h", "logprob": -0.5, "bytes": [104]}, {"token": "a", "logprob": -1.5, "bytes": [97]}]}]}
    assert content.take()["content"] == []                      # taken once
    assert missing_logprobs([1, 2], [TokenLogprob(-0.1)]) and missing_logprobs([1], [TokenLogprob(-0.1)]) is None
