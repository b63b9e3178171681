"""Orpheus tiny served by a real `mstar-run`: /v1/audio/speech streamed as SNAC decodes.

The LM's tokens stream worker-to-worker into the SNAC node's per-request sliding-window
buffer (28 / 7); each released window is decoded in a batch across requests and sent at
once. A frame is 2048 samples at 24 kHz.
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import time
import wave

import openai
import pytest

from tests.runtime.serving.conftest import http as request_json
from tests.runtime.serving.speech.conftest import ORPHEUS, serve
from tests.runtime.serving.speech.playback import sse_events, stream_many

SAMPLES_PER_FRAME = 2048
KV = 'mstar_worker_kv_used_blocks{node="lm",rank="0"}'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory, "orpheus")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def speak(client: openai.OpenAI, stream: bool, **extra) -> bytes:
    body = {"seed": 5, "max_tokens": 70, **extra, **({"stream": True} if stream else {})}
    with client.audio.speech.with_streaming_response.create(
            model=ORPHEUS, voice="tara", input="Hello there.", response_format="pcm", extra_body=body) as resp:
        return b"".join(resp.iter_bytes())


def test_first_chunk_arrives_while_the_lm_still_generates(server) -> None:
    running_at_first_chunk = []
    body = {"model": ORPHEUS, "voice": "tara", "input": "A long sentence.", "seed": 1, "max_tokens": 280}
    events = sse_events(server.port, body,
                        on_first_audio=lambda: running_at_first_chunk.append(server.metric("mstar_running_requests")))
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert running_at_first_chunk == [1.0]           # the request was still decoding tokens
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] == 280
    # first window (28 tokens): frames 0 and 1; then one frame per 7 tokens; the last window, which
    # ends the stream, also carries the 2 lagged tail frames: 40 frames in 1 + 36 chunks
    assert len(deltas) == 1 + (280 - 28) // 7
    assert sum(len(base64.b64decode(d["audio"])) for d in deltas) == 2 * 40 * SAMPLES_PER_FRAME


def test_streamed_chunks_concatenate_to_the_whole_file(client) -> None:
    whole = speak(client, stream=False)
    streamed = speak(client, stream=True)
    assert len(whole) == 2 * 10 * SAMPLES_PER_FRAME    # 70 tokens = 10 frames, each emitted once
    assert streamed == whole
    assert len(set(whole)) > 16                      # real SNAC output, not a silenced window


def test_wav_whole_and_streamed_headers(client, server) -> None:
    whole = client.audio.speech.create(model=ORPHEUS, voice="tara", input="Hello there.", response_format="wav",
                                       extra_body={"seed": 5, "max_tokens": 70}).content
    with wave.open(io.BytesIO(whole)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        pcm = w.readframes(w.getnframes())
    assert pcm == speak(client, stream=False)
    with client.audio.speech.with_streaming_response.create(
            model=ORPHEUS, voice="tara", input="Hello there.", response_format="wav",
            extra_body={"seed": 5, "max_tokens": 70, "stream": True}) as resp:
        streamed = b"".join(resp.iter_bytes())
    assert streamed[:4] == b"RIFF" and streamed[4:8] == b"\xff\xff\xff\xff" and streamed[40:44] == b"\xff\xff\xff\xff"
    assert streamed[44:] == pcm


def test_concurrent_streams_deliver_every_frame(server) -> None:
    """Gap-free playback depends on this machine's speed (`tools/bench.py speech` measures it);
    the ordering that prevents gaps is tested in test_playback_model.py."""
    bodies = [{"model": ORPHEUS, "voice": "tara", "input": f"Line {i}.", "seed": i, "max_tokens": 70,
               "response_format": "pcm"} for i in range(4)]
    for got in stream_many(server.url, bodies):
        assert len(got.pcm) == 7 and sum(map(len, got.pcm)) == 2 * 10 * SAMPLES_PER_FRAME


def test_disconnect_frees_buffers_and_kv_blocks(server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/audio/speech", json.dumps({"model": ORPHEUS, "voice": "tara", "input": "Long.",
                                                         "stream_format": "sse", "max_tokens": 4000}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    while not resp.readline().startswith(b"data: "):
        pass
    time.sleep(0.6)                                  # a heartbeat reports the rank's holdings
    held = (server.metric(KV), server.metric('mstar_stream_buffers{where="workers"}'),
            server.metric('mstar_stream_buffers{where="conductor"}'))
    conn.close()                                     # the client goes away mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (server.metric(KV) or server.metric('mstar_stream_buffers{where="workers"}')):
        time.sleep(0.2)
    assert held[0] > 0 and held[1] == 1 and held[2] == 1
    assert server.metric(KV) == 0
    assert server.metric('mstar_stream_buffers{where="workers"}') == 0
    assert server.metric('mstar_stream_buffers{where="conductor"}') == 0
    assert server.metric("mstar_running_requests") == 0


def test_audio_metrics_are_exported(server, client) -> None:
    speak(client, stream=True)
    assert server.metric("mstar_audio_time_to_first_audio_seconds_count") >= 1
    assert server.metric("mstar_audio_real_time_factor_count") >= 1
    assert server.metric("mstar_audio_seconds_sum") > 0
    assert server.metric("mstar_audio_stream_underruns_total") >= 0


@pytest.mark.parametrize("body, field", [
    ({"input": "hi", "voice": "nobody"}, "voice"),
    ({"input": "hi", "voice": "tara", "response_format": "flac"}, "response_format"),
    ({"input": "", "voice": "tara"}, "input"),
    ({"input": "hi", "voice": "tara", "stream_format": "mp3"}, "stream_format"),
])
def test_bad_speech_requests_name_the_field(server, body, field) -> None:
    status, answer = request_json("POST", f"{server.url}/v1/audio/speech", {"model": ORPHEUS, **body})
    assert status == 400 and answer["error"]["param"] == field


def test_chat_with_audio_needs_a_talker(server) -> None:
    status, answer = request_json("POST", f"{server.url}/v1/chat/completions", {
        "model": ORPHEUS, "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]})
    assert status == 400 and answer["error"]["param"] == "modalities"
