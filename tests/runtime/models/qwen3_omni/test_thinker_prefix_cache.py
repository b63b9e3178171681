"""The Qwen3-Omni thinker with its prefix cache, in-process on the tiny preset's random weights.

Chats share a system prompt; each Run reuses what `blocks.prefix_hit` finds (the count the
conductor's mirror of this cache sends as `WorkItem.cached`), and another thinker on the same
module is given `cached = 0` (what `--no-prefix-cache` sends). Greedy tokens must be equal.
A message with an image: the text before the picture is reused, the picture's piece holds
placeholders (their ids do not say which picture) and is neither looked up nor cached.
"""
from __future__ import annotations

import pytest

from mstar_compiler.pipeline import Options, compile_file
from runtime.conductor.request import MediaInput
from runtime.executors import executor_for
from runtime.server.chat_inputs import chat_inputs_for
from runtime.sampling import SamplingParams
from runtime.text import ByteTokenizer
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.loader import build_module
from tests.runtime.models.qwen3_omni.test_image_chat_parity import image_part, picture

SYSTEM = "You are a terse assistant. Answer with one word, never explain, never apologise, always be kind."
DECODE_STEPS = 4


@pytest.fixture(scope="module")
def omni():
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    modules = {n: build_module(plan.node(n), None).eval() for n in ("thinker", "vision_enc")}
    on, off = (executor_for(plan.node("thinker"), modules["thinker"], 0, plan) for _ in range(2))
    vision = executor_for(plan.node("vision_enc"), modules["vision_enc"], 0, plan)
    return plan, on, off, vision


def _answer(thinker, vision, rid: int, items, params: dict, reuse: bool) -> tuple[list[int], list[int]]:
    """Greedy tokens after the prompt's items, and the cached count each item was given."""
    thinker.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0), family=dict(params)))
    given = []
    for dtype, value in items:
        tokens = value.tokens if isinstance(value, MediaInput) else value
        cached = thinker.blocks.prefix_hit(tokens, after=rid if rid in thinker.blocks else None) if reuse else 0
        given.append(cached)
        if isinstance(value, MediaInput):
            (enc,) = vision.run([WorkItem(request_id=rid, step=0, walk="read_image")], [{"image": value.value}])
            inputs = {"embeds": enc.outputs["hidden"], "deepstack": enc.outputs["deepstack"]}
            result = thinker.run([WorkItem(request_id=rid, step=1, walk="read_image", tokens=tokens, cached=cached)],
                                 [inputs])
        else:
            result = thinker.run([WorkItem(request_id=rid, step=0, walk="read_text", tokens=tokens, cached=cached)],
                                 [{}])
    out = list(result[0].tokens)
    for _ in range(DECODE_STEPS):
        out += thinker.run([WorkItem(request_id=rid, step=0, walk="think", tokens=out[-1:])], [{}])[0].tokens
    thinker.close(rid, kv_only=False)
    return out, given


def test_chats_sharing_a_system_prompt_and_one_with_an_image_answer_as_without_the_cache(omni) -> None:
    plan, on, off, vision = omni
    reader, tokenizer = chat_inputs_for(plan), ByteTokenizer()
    chats = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
             for q in ("Capital of France?", "Capital of Peru?")]
    question = [image_part(picture(56, 84, seed=4)), {"type": "text", "text": "What?"}]
    chats.append([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    stats = on.blocks.allocator.stats
    for rid, messages in enumerate(chats, start=1):
        # a text-only chat is one text item, laid out as the reader lays out a chat with media
        items = reader.chat_items(messages, tokenizer) or [("text", reader._prompt_ids(messages, tokenizer, []))]
        params = reader.request_params(items)
        hits_before = stats.hit_tokens
        got, given = _answer(on, vision, rid, items, params, reuse=True)
        want, _ = _answer(off, vision, rid, items, params, reuse=False)
        assert got == want, f"chat {rid}"
        if rid > 1:   # the system prompt's full blocks, from the first chat
            assert given[0] >= len(SYSTEM) // 16 * 16 - 16 and stats.hit_tokens - hits_before == given[0]
    assert [dtype for dtype, _ in items] == ["text", "image", "text"]
    assert given[1:] == [0, 0]        # the picture's piece and the text after it reuse nothing
