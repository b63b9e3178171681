"""Qwen3-Omni tiny sees, through a real `mstar-run` and the real `openai` client.

A chat with an `image_url` part answers what transformers' thinker (holding the server's seeded
weights) answers greedily for the same picture through the published image processor; another
picture gets another answer, so an ignored image fails. Video frames, undecodable and oversized
pictures, and audio inside a video get a 4xx and the server goes on serving.
"""
from __future__ import annotations

import base64

import openai
import pytest
import torch

from mstar_compiler.pipeline import Options, compile_file
from runtime.text import ByteTokenizer
from runtime.worker.loader import build_module
from tests.runtime.models.qwen3_omni.omni_reference import thinker_reference
from tests.runtime.models.qwen3_omni.test_image_chat_parity import (VISION, chat_ids, hf_image_processor, image_ids,
                                                                      image_part, picture)
from tests.runtime.models.qwen3_omni.test_video_file import video_file, video_url_part
from tests.runtime.serving.conftest import http as request_json
from tests.runtime.serving.speech.conftest import OMNI

MAX_TOKENS = 8
QUESTION = b"What is it?"


@pytest.fixture
def single(omni_single):
    return omni_single


@pytest.fixture(scope="module")
def reference():
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    return thinker_reference(*(build_module(plan.node(n), None) for n in ("thinker", "audio_enc")),
                             vision=build_module(plan.node("vision_enc"), None))


@torch.no_grad()
def greedy(reference, image) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, greedy answer ids, their log-probabilities) of transformers' thinker for [image, QUESTION]."""
    pixels = hf_image_processor()(image, return_tensors="pt")
    ids = chat_ids(image_ids(int(pixels["image_grid_thw"].prod()) // VISION["spatial_merge_size"] ** 2),
                   list(QUESTION))
    sequence, logprobs = torch.tensor([ids]), []
    for _ in range(MAX_TOKENS):
        logits = reference(input_ids=sequence, attention_mask=torch.ones_like(sequence), **pixels).logits
        sequence = torch.cat([sequence, logits[:, -1:].argmax(-1)], dim=1)
        logprobs.append(float(logits[0, -1].log_softmax(-1).max()))
    return ids, sequence[0, len(ids):].tolist(), logprobs


def ask(server, image) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    return client.chat.completions.create(
        model=OMNI, max_tokens=MAX_TOKENS, temperature=0.0, logprobs=True,
        messages=[{"role": "user", "content": [image_part(image), {"type": "text", "text": QUESTION.decode()}]}])


def test_chat_with_a_video_file_answers(single) -> None:
    client = openai.OpenAI(base_url=f"{single.url}/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=OMNI, max_tokens=2, temperature=0.0, messages=[{"role": "user", "content": [
        video_url_part(video_file(10, 5, 32, 48, "webm"), "webm"), {"type": "text", "text": "?"}]}])
    # 4 sampled frames of 32 x 48 in 8-pixel patches: 2 temporal x 4 x 6 patches, 2 x 2 merged -> 12 pads
    assert reply.usage.completion_tokens == 2 and reply.usage.prompt_tokens == len(chat_ids([0] * 14, [0]))


def test_chat_with_an_image_answers_as_transformers_thinker(single, reference) -> None:
    answers = []
    for seed in (1, 2):
        image = picture(40, 56, seed)
        ids, expected, logprobs = greedy(reference, image)
        reply = ask(single, image)
        assert reply.usage.prompt_tokens == len(ids)
        assert reply.usage.completion_tokens == MAX_TOKENS
        assert reply.choices[0].message.content == ByteTokenizer().decode(expected)
        got = [e.logprob for e in reply.choices[0].logprobs.content]
        # fp32 both sides, as the thinker parity tests compare logits: transformers' eager thinker against the
        # served one, the same layers in other op orders, a few ulps (eps 1.2e-7) each; measured max 4.8e-7 on
        # logprobs |lp| <= 5.9
        torch.testing.assert_close(torch.tensor(got), torch.tensor(logprobs), rtol=1e-4, atol=1e-4)
        answers.append(expected)
    assert answers[0] != answers[1]         # the picture is read: another one, another answer


def _hit_tokens(server) -> float:
    """The thinker's reused tokens on /metrics (reported by its worker from its Ready on: 0 at first)."""
    return server.metric("mstar_prefix_cache_hit_tokens_total")


def test_a_picture_asked_about_again_is_reused_from_the_prefix_cache(single) -> None:
    """The thinker keys a picture's rows by its encoder output: the second ask reuses the system
    prompt, the picture and the question (all but the last block of each prompt piece) and answers
    as the first did, logprobs bit-equal (docs/prefill.md: fp32 on the panel GEMM, and no piece leaves
    a single row to compute)."""
    client = openai.OpenAI(base_url=f"{single.url}/v1", api_key="unused", max_retries=0, timeout=120)
    system = "You describe pictures in one short sentence, plainly, for a child who cannot see them. " * 2
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": [image_part(picture(40, 56, 3)), {"type": "text", "text": system}]}]
    replies, hits = [], []
    for _ in range(2):
        before = _hit_tokens(single)
        replies.append(client.chat.completions.create(model=OMNI, max_tokens=MAX_TOKENS, temperature=0.0,
                                                      logprobs=True, messages=messages))
        hits.append(_hit_tokens(single) - before)
    assert replies[1].choices[0].message.content == replies[0].choices[0].message.content
    assert [e.logprob for e in replies[1].choices[0].logprobs.content] == \
        [e.logprob for e in replies[0].choices[0].logprobs.content]
    prompt = replies[0].usage.prompt_tokens
    assert hits[1] - hits[0] > prompt - 3 * 16       # three pieces: text, picture, text


def _frames(n: int) -> list[str]:
    return [image_part(picture(32, 32, k))["image_url"]["url"] for k in range(n)]


@pytest.mark.parametrize("part,status,code", [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"nope").decode()}},
     400, None),
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, 400, None),
    ({"type": "video", "video": _frames(9)}, 413, "video_too_long"),                  # tiny: max_video_frames 8
    ({"type": "video", "video": _frames(2), "audio": "in"}, 400, "unsupported_input"),
    ({"type": "video", "video": _frames(2), "fps": 3}, 400, None),                    # 2/3 s per patch x 13
    (image_part(picture(300, 300, 0)), 400, "image_too_large"),                       # tiny: max_image_pixels 65536
    ({"type": "video", "video": [image_part(picture(160, 160, 0))["image_url"]["url"]] * 2}, 400, "image_too_large"),
    (video_url_part(video_file(4, 5, 144, 128), "mp4"), 413, "video_too_large"),      # max_video_frame_pixels 16384
    (video_url_part(video_file(45, 5, 32, 32, "webm"), "webm"), 413, "video_too_long"),       # 18 frames sampled at 2 fps
    (video_url_part(b"\x1aE\xdf\xa3 not a webm", "webm"), 400, "invalid_video"),
])
def test_bad_pictures_get_a_4xx_and_the_server_goes_on(single, part, status, code) -> None:
    got, body = request_json("POST", f"{single.url}/v1/chat/completions",
                             {"model": OMNI, "messages": [{"role": "user", "content": [part]}]})
    assert got == status and body["error"]["message"]
    assert code is None or body["error"]["code"] == code
    assert request_json("GET", f"{single.url}/health")[0] == 200
