"""Qwen3-Omni tiny served by real `mstar-run` processes: three concurrent tracks per request.

The thinker streams its input embeddings to the talker (fixed 1, worker to worker), the
talker + code predictor stream codec frames to code2wav (left context 25 + 25). One
server runs everything on one rank (`single`); another puts talker, code predictor and
code2wav on a second rank (`thinker_talker`): the thinker stream then crosses ranks.
"""
from __future__ import annotations

import base64
import io
import wave

import openai
import pytest

from tests.runtime.models.qwen3_omni.test_image_chat_parity import image_part, picture
from tests.runtime.serving.conftest import http as request_json
from tests.runtime.serving.speech.conftest import OMNI, serve
from tests.runtime.serving.speech.playback import sse_events, stream_many

SAMPLES_PER_FRAME = 1920          # tiny code2wav: 4 x 480 upsampling
MESSAGES = [{"role": "user", "content": "Say something nice."}]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    yield from serve(tmp_path_factory, "qwen3_omni", "single")


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    yield from serve(tmp_path_factory, "qwen3_omni", "thinker_talker")


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def speech_pcm(server, **extra) -> bytes:
    status, _ = request_json("GET", f"{server.url}/health")
    assert status == 200
    with client_of(server).audio.speech.with_streaming_response.create(
            model=OMNI, voice="ethan", input="Hello there.", response_format="pcm",
            extra_body={"seed": 2, **extra}) as resp:
        return b"".join(resp.iter_bytes())


def audio_chat_stream(server, **extra) -> tuple[str, bytes, list[str], str, list]:
    """(transcript, pcm, order of delta kinds, finish reason, logprobs entries) of a streamed audio chat."""
    text, pcm, kinds, finish, logprobs = "", b"", [], "", []
    for chunk in client_of(server).chat.completions.create(
            model=OMNI, messages=MESSAGES, modalities=["text", "audio"], audio={"voice": "chelsie", "format": "pcm16"},
            stream=True, seed=4, **extra):
        choice = chunk.choices[0]
        logprobs += choice.logprobs.content if choice.logprobs else []
        audio = choice.delta.audio
        if audio is not None and getattr(audio, "transcript", None):
            text, kinds = text + audio.transcript, kinds + ["text"]
        if audio is not None and getattr(audio, "data", None):
            pcm, kinds = pcm + base64.b64decode(audio.data), kinds + ["audio"]
        finish = choice.finish_reason or finish
    return text, pcm, kinds, finish, logprobs


def test_chat_with_audio_streams_text_and_audio_together(single) -> None:
    asked = {"logprobs": True, "top_logprobs": 2}
    text, pcm, kinds, finish, logprobs = audio_chat_stream(single, **asked)
    assert text and pcm and "text" in kinds and "audio" in kinds
    assert finish == "length"                       # random weights never say <|im_end|>: max_tokens (16)
    whole = client_of(single).chat.completions.create(model=OMNI, messages=MESSAGES, modalities=["text", "audio"],
                                                      audio={"voice": "chelsie", "format": "wav"}, seed=4, **asked)
    message = whole.choices[0].message
    assert message.content is None and message.audio.transcript == text
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as w:
        assert w.getframerate() == 24000 and w.readframes(w.getnframes()) == pcm
    assert whole.usage.completion_tokens == 16
    entries = whole.choices[0].logprobs.content     # the transcript's tokens, as a text chat's
    assert len(entries) == 16 and all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    # the same seeded request, one thinker step at a time both ways: the same float ops
    assert [(e.token, e.logprob) for e in logprobs] == [(e.token, e.logprob) for e in entries]


def test_speech_streams_code2wav_chunks_while_the_talker_speaks(single) -> None:
    running_at_first_chunk = []
    body = {"model": OMNI, "voice": "ethan", "input": "Hello there.", "seed": 2, "max_audio_frames": 60,
            "response_format": "pcm"}
    events = sse_events(single.port, body,
                        on_first_audio=lambda: running_at_first_chunk.append(single.metric("mstar_running_requests")))
    pcm = [base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"]
    assert running_at_first_chunk == [1.0]                                # the talker was still speaking
    assert len(pcm) >= 2 and len(pcm[0]) // 2 == 25 * SAMPLES_PER_FRAME - 555   # the first 25 frames
    assert b"".join(pcm) == speech_pcm(single, max_audio_frames=60)


def test_colocated_and_split_placements_speak_identically(single, split) -> None:
    assert speech_pcm(single) == speech_pcm(split)
    assert audio_chat_stream(single) == audio_chat_stream(split)


def test_voice_chat_with_an_image_speaks_identically_colocated_and_split(single, split) -> None:
    """The picture's rows, DeepStack and the talker's multimodal states cross ranks unchanged."""
    messages = [{"role": "user", "content": [image_part(picture(32, 48, 9)), {"type": "text", "text": "Describe."}]}]
    spoken = []
    for server in (single, split):
        reply = client_of(server).chat.completions.create(
            model=OMNI, messages=messages, modalities=["text", "audio"], audio={"voice": "ethan", "format": "wav"},
            max_tokens=6, temperature=0.0)
        spoken.append((reply.choices[0].message.audio.transcript, reply.choices[0].message.audio.data))
    assert spoken[0] == spoken[1] and spoken[0][0] and spoken[0][1]


def test_32_concurrent_streams_all_complete_with_batched_talker_steps(single) -> None:
    """Whether they also play without gaps depends on this machine's speed: that is measured by
    `tools/bench.py speech`; the ordering that prevents gaps is test_playback_model.py's."""
    bodies = [{"model": OMNI, "voice": "ethan", "input": f"Line {i}.", "seed": i, "max_audio_frames": 60,
               "response_format": "pcm"} for i in range(32)]
    received = stream_many(single.url, bodies)
    assert all(got.pcm and got.done for got in received)
    assert single.metric('mstar_batch_size_count{node="talker"}') < sum(
        sum(map(len, got.pcm)) for got in received) / SAMPLES_PER_FRAME   # talker steps were batched


def test_text_chat_still_answers_with_text(single) -> None:
    out = client_of(single).chat.completions.create(model=OMNI, messages=MESSAGES, max_tokens=5, seed=1,
                                                    logprobs=True, top_logprobs=1)
    assert isinstance(out.choices[0].message.content, str) and out.usage.completion_tokens == 5
    assert [len(e.top_logprobs) for e in out.choices[0].logprobs.content] == [1] * 5
