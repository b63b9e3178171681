"""The Qwen3-Omni thinker with its prefix cache, in-process on the tiny preset's random weights.

Each thinker runs under `LocalRun` (runtime/conductor/local_run.py): the conductor's tables for its pool,
grown and keyed as the scheduler grows them, a media piece's pads named by the media item
(runtime/conductor/media_keys.py), and `WorkItem.cached` set to what the pool reuses. Another thinker
on the same module runs with prefix caching off (`--no-prefix-cache`). The linears are packed as a
worker's loader packs them, so a row's result does not depend on how many rows its forward holds, and the
prefill kernel's rows do not depend on their context: greedy tokens and the last-row logits of every
Run are bit-equal with the cache and without it, as docs/prefill.md says. A piece that leaves one row
to compute is the exception that page names: a one-row chunk is a decode row to the attention backend.

What is reused is checked exactly: a Run of a prompt piece starting at row `s` with `n` rows,
after a request that cached its first `c` rows in full blocks, reuses the rows of those blocks from
`s` on, leaving its last row to compute (`expected_reuse`).
"""
from __future__ import annotations

import pytest
import torch

from mstar_compiler.pipeline import Options, compile_file
from runtime.conductor.local_run import LocalRun
from runtime.conductor.request import MediaInput
from runtime.worker.executors import executor_for
from runtime.model_executor.parallel import pack_linears
from runtime.model_executor.sampling import SamplingParams
from runtime.entrypoints.http.chat_inputs import chat_inputs_for
from runtime.text import ByteTokenizer
from runtime.transport.messages import StreamRoute, WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.loader import build_module
from tests.runtime.models.qwen3_omni.test_audio_chat_parity import audio_part, wav_bytes
from tests.runtime.models.qwen3_omni.test_image_chat_parity import image_part, picture

SYSTEM = "You are a terse assistant. Answer with one word, never explain, never apologise, always be kind."
DECODE_STEPS = 4
# a one-row chunk (129 prompt tokens, 128 of them cached) goes to paged_decode, which sums a row's keys in another
# order than paged_prefill did for the same row cold (docs/prefill.md): an fp32 ulp or so (eps 1.2e-7) per layer on
# logits |l| <= 0.6; measured max 1.0e-7
ONE_ROW_ATOL = 1e-4
BS = 16                      # the tiny plan's KV block size (checked in the fixture)
ENCODERS = {"image": ("vision_enc", "image", "read_image"), "audio": ("audio_enc", "audio", "read_audio")}
TO_TALKER = [StreamRoute("thinker_hidden", "hidden", 0, 0)]   # a voice chat's thinker Runs feed the talker


@pytest.fixture(scope="module")
def omni():
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    modules = {n: build_module(plan.node(n), None).eval() for n in ("thinker", "vision_enc", "audio_enc")}
    for module in modules.values():
        pack_linears(module)        # as a worker's loader does: without it F.linear's blocking follows the row count
    on, off = (LocalRun(executor_for(plan.node("thinker"), modules["thinker"], 0, plan), prefix_cache=cache)
               for cache in (True, False))
    pads = {plan.node("talker").dims[k] for k in ("audio_token_id", "image_token_id", "video_token_id")}
    # the conductor keys this pool: the pads named by their media item, reuse decided there
    assert on.pool.block_size == BS and on.pool.prefix_root is not None and on.pool.media_ids == pads
    assert off.pool.prefix_root is None and on.executor.kv_pool == ""
    encoders = {n: executor_for(plan.node(n), modules[n], 0, plan) for n in ("vision_enc", "audio_enc")}
    return plan, on, off, encoders


def _encode(encoders, rid: int, dtype: str, value: MediaInput) -> dict[str, torch.Tensor]:
    name, port, walk = ENCODERS[dtype]
    (enc,) = encoders[name].run([WorkItem(request_id=rid, step=0, walk=walk)], [{port: value.value}])
    return {"embeds": enc.outputs["hidden"], **({"deepstack": enc.outputs["deepstack"]}
                                                 if "deepstack" in enc.outputs else {})}


def _piece(dtype: str, value) -> list[int]:
    return value.tokens if isinstance(value, MediaInput) else value


def _media(value) -> MediaInput | None:
    return value if isinstance(value, MediaInput) else None


def _answer(run: LocalRun, encoders, rid: int, items, params: dict, stream: bool = False):
    """(greedy tokens, last-row logits of every Run, rows each prompt piece reused, the prompt's
    `hidden:mm` when its Runs feed a talker)."""
    model = run.executor.model
    logits, spy = [], model.compute_logits
    model.compute_logits = lambda h: logits.append(spy(h)) or logits[-1]
    run.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0), family=dict(params)))
    reused = []
    try:
        for dtype, value in items:
            ins = _encode(encoders, rid, dtype, value) if isinstance(value, MediaInput) else {}
            item = WorkItem(request_id=rid, walk=ENCODERS.get(dtype, ("", "", "read_text"))[2],
                            tokens=_piece(dtype, value), stream_out=list(TO_TALKER) if stream else [])
            result = run.run([item], [ins], [_media(value)])
            reused.append(item.cached)
        mm = result[0].outputs.get("hidden:mm")
        out = list(result[0].tokens)
        for _ in range(DECODE_STEPS):
            out += run.run([WorkItem(request_id=rid, walk="think", tokens=out[-1:])], [{}])[0].tokens
    finally:
        run.close(rid, kv_only=False)
        model.compute_logits = spy
    return out, torch.cat(logits), reused, mm


def _same_answer(omni, rid: int, items, stream: bool = False) -> tuple[list[int], list[int]]:
    """Answer with the cache on and off: equal tokens, bit-equal logits (and `hidden:mm`), the
    reused rows counted; the tokens and what each piece reused."""
    plan, on, off, encoders = omni
    params = chat_inputs_for(plan).request_params(items)
    hit_tokens = on.pool.stats.hit_tokens
    got, got_logits, reused, got_mm = _answer(on, encoders, rid, items, params, stream)
    assert on.pool.stats.hit_tokens - hit_tokens == sum(reused)     # what /metrics shows
    want, want_logits, _, want_mm = _answer(off, encoders, rid, items, params, stream)
    assert got == want
    torch.testing.assert_close(got_logits, want_logits, atol=0, rtol=0)
    if stream:
        torch.testing.assert_close(got_mm, want_mm, atol=0, rtol=0)
    return got, reused


def expected_reuse(items, cached_rows: int) -> list[int]:
    """Rows each piece reuses when the cache holds the chain of these pieces' first `cached_rows` rows."""
    out, start = [], 0
    for dtype, value in items:
        n = len(_piece(dtype, value))
        out.append(max(0, min((start + n - 1) // BS, cached_rows // BS) * BS - start))
        start += n
    return out


def _chat(plan, messages) -> list:
    reader, tokenizer = chat_inputs_for(plan), ByteTokenizer()
    return reader.chat_items(messages, tokenizer) or [("text", reader._prompt_ids(messages, tokenizer, []))]


def _picture_chat(plan, seed: int, frames: int = 0) -> list:
    """A chat about a picture, or about a video of `frames` frames (many blocks of placeholders)."""
    if frames:
        media = {"type": "video", "fps": 2.0,
                 "video": [image_part(picture(56, 84, seed=seed + i))["image_url"]["url"] for i in range(frames)]}
    else:
        media = image_part(picture(112, 168, seed=seed))
    question = [media, {"type": "text", "text": "What is in this picture?"}]
    return _chat(plan, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def _next_turn(plan, items, answer: list[int], question: str) -> list:
    """The conversation resent with the answer and a new question (the byte tokenizer's ChatML)."""
    tokenizer = ByteTokenizer()
    asked = chat_inputs_for(plan)._prompt_ids([{"role": "user", "content": question}], tokenizer, [])
    return [*items[:-1], ("text", [*items[-1][1], *answer, *tokenizer.encode("\n"), *asked])]


def test_chats_sharing_a_system_prompt_reuse_it(omni) -> None:
    plan = omni[0]
    chats = [_chat(plan, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
             for q in ("Capital of France?", "Capital of Peru?")]
    _same_answer(omni, 1, chats[0])
    _, reused = _same_answer(omni, 2, chats[1])
    assert reused[0] >= len(SYSTEM) // BS * BS - BS


@pytest.mark.parametrize("frames", [0, 8], ids=["image", "video"])
def test_a_second_turn_about_a_picture_reuses_the_picture_and_the_first_turn(omni, frames: int) -> None:
    plan = omni[0]
    first = _picture_chat(plan, seed=4, frames=frames)
    assert [dtype for dtype, _ in first] == ["text", "image", "text"]
    answer, _ = _same_answer(omni, 10, first)
    second = _next_turn(plan, first, answer, "And its colour?")
    _, reused = _same_answer(omni, 11, second)
    prompt_rows = sum(len(_piece(*it)) for it in first)
    # every full block of the first turn's rows (prompt and fed answer tokens), but each piece's last row
    assert reused == expected_reuse(second, prompt_rows + DECODE_STEPS)
    pads = len(first[1][1].tokens)
    assert reused[1] > pads - BS and reused[2] > len(first[2][1]) - BS
    if frames:
        assert pads > 2 * BS

    # a voice chat's Runs feed the talker the states at the pads: a reused pad's state was kept at its cache
    # slot when the first turn computed it, bit-equal to a computed one (`_same_answer` compares `hidden:mm`)
    _, reused = _same_answer(omni, 12, second, stream=True)
    assert reused == expected_reuse(second, sum(len(_piece(*it)) for it in second) + DECODE_STEPS)
    assert reused[1] > pads - BS


def test_another_picture_with_the_same_text_reuses_only_the_text_before_it(omni) -> None:
    plan = omni[0]
    _same_answer(omni, 20, _picture_chat(plan, seed=5))
    other = _picture_chat(plan, seed=6)
    _, reused = _same_answer(omni, 21, other)
    assert reused == [(len(other[0][1]) - 1) // BS * BS, 0, 0]


def test_a_chat_with_audio_reuses_the_audio_span(omni) -> None:
    plan = omni[0]
    content = [audio_part(wav_bytes(3.0, 16000)), {"type": "text", "text": "What do you hear?"}]
    items = _chat(plan, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}])
    assert [dtype for dtype, _ in items] == ["text", "audio", "text"]
    _same_answer(omni, 30, items)
    _, reused = _same_answer(omni, 31, items)
    prompt_rows = sum(len(_piece(*it)) for it in items)
    assert reused == expected_reuse(items, prompt_rows + DECODE_STEPS)
    assert len(items[1][1].tokens) > 2 * BS and reused[1] > len(items[1][1].tokens) - BS
    # spoken: the audio span's states for the talker were kept when it was computed, so it is reused too
    assert _same_answer(omni, 32, items, stream=True)[1] == reused


def test_a_failed_forward_keys_nothing_it_was_to_write(omni) -> None:
    """A shared batch fails (the second request's embeds do not fit its pads): the first request's
    picture rows were reserved, never written, so none is keyed, nor once the requests' tables are
    freed (the conductor retries each alone from scratch); run again alone, it reuses none of them."""
    plan, on, _, encoders = omni
    good, bad = _picture_chat(plan, seed=7), _picture_chat(plan, seed=8)
    for rid, items in ((40, good), (41, bad)):
        on.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0),
                                   family=chat_inputs_for(plan).request_params(items)))
        on.run([WorkItem(request_id=rid, walk="read_text", tokens=items[0][1])], [{}])
    embeds = [_encode(encoders, 40, "image", good[1][1]), _encode(encoders, 41, "image", bad[1][1])]
    embeds[1] = {k: v[..., :-1, :] for k, v in embeds[1].items()}     # one row short
    cached = on.pool.tables.allocator.num_cached
    batch = [WorkItem(request_id=rid, walk="read_image", tokens=items[1][1].tokens)
             for rid, items in ((40, good), (41, bad))]
    with pytest.raises(ValueError, match="placeholder rows but"):
        on.run(batch, embeds, [good[1][1], bad[1][1]])
    assert on.pool.tables.allocator.num_cached == cached
    for rid in (40, 41):      # as the conductor does after a shared batch fails: each retries alone, recomputed
        on.close(rid, kv_only=False)
    assert on.pool.tables.allocator.num_cached == cached
    _, reused = _same_answer(omni, 42, good)
    assert reused[1:] == [0, 0]


def test_a_batch_of_a_reused_text_piece_and_a_picture_piece_answers_as_each_alone(omni) -> None:
    """The picture's embeds go to its rows in the batch, which start after the computed rows only
    of the text piece before it (its reused rows are not in the forward)."""
    plan, on, off, encoders = omni
    text = _chat(plan, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Capital of Chile?"}])
    pictured = _picture_chat(plan, seed=9)
    _same_answer(omni, 60, text)                                  # the system prompt is cached now
    logits = {}
    for thinker in (on, off):
        model = thinker.executor.model
        spy, got = model.compute_logits, []
        model.compute_logits = lambda h, spy=spy, got=got: got.append(spy(h)) or got[-1]
        for rid, items in ((61, text), (62, pictured)):
            thinker.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0),
                                            family=chat_inputs_for(plan).request_params(items)))
        thinker.run([WorkItem(request_id=62, walk="read_text", tokens=pictured[0][1])], [{}])
        batch = [WorkItem(request_id=61, walk="read_text", tokens=text[0][1]),
                 WorkItem(request_id=62, walk="read_image", tokens=pictured[1][1].tokens)]
        thinker.run(batch, [{}, _encode(encoders, 62, "image", pictured[1][1])], [None, pictured[1][1]])
        assert (batch[0].cached > 0) == (thinker is on)
        model.compute_logits = spy
        for rid in (61, 62):
            thinker.close(rid, kv_only=False)
        logits[thinker is on] = got[-1]
    torch.testing.assert_close(logits[True], logits[False], atol=ONE_ROW_ATOL, rtol=0)
