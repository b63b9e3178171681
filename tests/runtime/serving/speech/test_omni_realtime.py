"""/v1/realtime against a real Qwen3-Omni tiny server: the OpenAI Realtime core events over a real WebSocket.

The client is aiohttp's WebSocket client; the server is the package's shared `omni_single`
(no server start of its own). Heard windows are read from /metrics and the graph's client-fed
`user_audio` stream from /v1/state: the tiny encoder attends in 2 s windows (the stream's
`fixed: 200` frames), so a 3 s utterance streamed in 100 ms chunks has one window encoded by
`audio_enc` before the commit, the rest of its frames waiting in the stream's buffer, and the 1 s
tail encoded at it. KV blocks and stream buffers are read from /metrics after a
cancel, a barge-in and a disconnect mid-answer.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import time
from typing import Any, Iterator

import aiohttp
import openai
import pytest

from runtime.models.qwen3_omni.mel_featuriser import PCM_RATE
from runtime.entrypoints.http.audio_io import wav
from tests.runtime.models.qwen3_omni.test_mel_featuriser import chunks, utterance
from tests.runtime.serving.conftest import http
from tests.runtime.serving.speech.conftest import OMNI

WINDOWS = 'mstar_realtime_audio_windows_total{phase="%s"}'
KV_NODES = ("thinker", "talker")
MAX_TOKENS = 12


class Client:
    """One realtime session: send events, read server events in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, event_type: str, **fields: Any) -> None:
        await self.ws.send_str(json.dumps({"type": event_type, **fields}))

    async def recv(self, timeout: float = 60) -> dict:
        msg = await self.ws.receive(timeout=timeout)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        return json.loads(msg.data)

    async def until(self, event_type: str) -> list[dict]:
        """Every event up to and including the first of `event_type`."""
        seen = []
        while not seen or seen[-1]["type"] != event_type:
            seen.append(await self.recv())
        return seen

    async def speak(self, pcm: bytes) -> None:
        for piece in chunks(pcm):
            await self.send("input_audio_buffer.append", audio=base64.b64encode(piece).decode())


def session(server, body) -> Any:
    async def run() -> Any:
        async with aiohttp.ClientSession() as http, http.ws_connect(f"{server.url.replace('http', 'ws')}/v1/realtime") as ws:
            client = Client(ws)
            created = await client.recv()
            assert created["type"] == "session.created" and created["session"]["input_audio_format"] == "pcm16"
            return await body(client)
    return asyncio.run(run())


def _kv(server) -> float:
    return sum(server.metric(f'mstar_worker_kv_used_blocks{{node="{n}",rank="0"}}') or 0 for n in KV_NODES)


def _wait_freed(server) -> None:
    """Until the sessions have closed on the server and the workers report their KV and buffers freed."""
    deadline = time.monotonic() + 20            # heartbeats carry the workers' view: give them a few beats
    while time.monotonic() < deadline and (_kv(server) or server.metric('mstar_stream_buffers{where="workers"}')
                                           or server.metric("mstar_realtime_sessions")):
        time.sleep(0.2)


def _heard(server, phase: str) -> float:
    return server.metric(WINDOWS % phase)


async def _until_heard(server, phase: str, count: float) -> None:
    """Wait (generously: a loaded machine) until `count` windows of `phase` have been heard."""
    deadline = time.monotonic() + 60
    while _heard(server, phase) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def _encoder_state(server) -> tuple[int, dict]:
    """(audio_enc batches run, the user_audio stream's buffered frames and open requests) from /v1/state."""
    _, state = http("GET", f"{server.url}/v1/state")
    return state["nodes"]["audio_enc"]["batches"], state["streams"]["user_audio"]


async def _until_state(server, batches: int) -> tuple[int, dict]:
    """/v1/state once it shows `batches` encoder batches (a snapshot is up to 0.25 s old)."""
    deadline = time.monotonic() + 10
    while (seen := _encoder_state(server))[0] < batches and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return seen


def test_streamed_utterance_is_heard_while_spoken_and_answered_in_speech(omni_single):
    server = omni_single
    before = {p: _heard(server, p) for p in ("streamed", "commit")}
    batches_before = _encoder_state(server)[0]

    async def body(client: Client) -> tuple[float, tuple[int, dict], list[dict]]:
        await client.send("session.update", session={"instructions": "Answer briefly.", "voice": "ethan",
                                                     "modalities": ["audio", "text"]})
        assert (await client.recv())["type"] == "session.updated"
        await client.speak(utterance(3.0))
        await _until_heard(server, "streamed", before["streamed"] + 1)
        heard_before_commit = _heard(server, "streamed")      # nothing committed yet: heard while arriving
        state_before_commit = await _until_state(server, batches_before + 1)
        await client.send("input_audio_buffer.commit")
        committed = await client.until("conversation.item.created")
        await client.send("response.create")
        return heard_before_commit, state_before_commit, committed + await client.until("response.done")

    heard_before_commit, (batches, user_audio), events = session(server, body)
    assert batches == batches_before + 1                      # audio_enc ran once, on the stream's first window
    assert user_audio["num_requests"] == 1                    # the session's listen request, open before commit
    assert 0 < user_audio["buffered"] < 200                   # the frames after it wait for the commit
    types = [e["type"] for e in events]
    assert types[:2] == ["input_audio_buffer.committed", "conversation.item.created"]
    assert "response.created" in types and types[-1] == "response.done"
    assert events[-1]["response"]["status"] == "completed"
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.audio_transcript.delta")
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.audio.delta")
    assert transcript and len(audio) > 0 and len(audio) % 2 == 0
    assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == transcript
    assert heard_before_commit - before["streamed"] == 1      # 3 s: the one complete 2 s window, before commit
    assert _heard(server, "streamed") - before["streamed"] == 1
    assert _heard(server, "commit") - before["commit"] == 1   # and the 1 s tail at it
    _wait_freed(server)
    assert _kv(server) == 0


def test_realtime_answer_equals_chat_with_the_same_audio_as_a_file(omni_single):
    """The rows heard window by window reach the thinker as the whole file's do: same greedy text."""
    pcm = utterance(3.0, seed=2)

    async def body(client: Client) -> str:
        await client.send("session.update", session={"modalities": ["text"], "temperature": 0,
                                                     "max_response_output_tokens": MAX_TOKENS})
        await client.until("session.updated")
        await client.speak(pcm)
        await client.send("input_audio_buffer.commit")
        await client.until("conversation.item.created")
        await client.send("response.create")
        events = await client.until("response.done")
        assert not any(e["type"].startswith("response.audio") for e in events)   # text only
        return next(e["text"] for e in events if e["type"] == "response.text.done")

    text = session(omni_single, body)
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(pcm, PCM_RATE)).decode(),
                                                   "format": "wav"}}
    client = openai.OpenAI(base_url=f"{omni_single.url}/v1", api_key="unused", max_retries=0, timeout=120)
    out = client.chat.completions.create(model=OMNI, messages=[{"role": "user", "content": [part]}],
                                         max_tokens=MAX_TOKENS, temperature=0.0)
    assert text and text == out.choices[0].message.content


def test_cancel_barge_in_and_disconnect_stop_the_answer_and_free_kv(omni_single):
    server = omni_single
    cancelled = server.metric("mstar_realtime_responses_cancelled_total")

    async def answering(client: Client) -> None:
        await client.send("response.create")
        await client.until("response.audio_transcript.delta")

    async def body(client: Client) -> list[list[dict]]:
        # answers far longer than the tiny preset's 16 tokens, so none ends before its cancel arrives
        await client.send("session.update", session={"max_response_output_tokens": 2000})
        await client.until("session.updated")
        await client.speak(utterance(1.0, seed=1))
        await client.send("input_audio_buffer.commit")
        await client.until("conversation.item.created")
        await answering(client)
        await client.send("response.cancel")
        by_cancel = await client.until("response.done")
        await client.send("input_audio_buffer.clear")             # nothing of the cancelled answer follows
        after_cancel = await client.until("input_audio_buffer.cleared")
        await answering(client)
        await client.speak(utterance(0.1, seed=3))                 # the user speaks over the answer
        by_barge_in = await client.until("response.done")
        await answering(client)
        return [by_cancel, after_cancel, by_barge_in]              # the socket closes mid-answer

    by_cancel, after_cancel, by_barge_in = session(server, body)
    assert by_cancel[-1]["response"]["status"] == by_barge_in[-1]["response"]["status"] == "cancelled"
    assert [e["type"] for e in after_cancel] == ["input_audio_buffer.cleared"]
    assert server.metric("mstar_realtime_responses_cancelled_total") - cancelled == 2
    _wait_freed(server)
    assert _kv(server) == 0
    assert server.metric('mstar_stream_buffers{where="workers"}') == 0
    assert server.metric('mstar_stream_buffers{where="conductor"}') == 0
    assert server.metric("mstar_realtime_sessions") == 0


@pytest.mark.parametrize("event, code", [
    ("not json", "invalid_json"),
    ({"type": "no.such.event"}, "unknown_event"),
    ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x00" * 3).decode()}, "invalid_audio"),
    ({"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(2 * PCM_RATE * 9)).decode()},
     "audio_too_long"),                                       # 9 s: the tiny graph's max_audio_seconds is 8
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
    ({"type": "response.create"}, "empty_conversation"),
    ({"type": "response.cancel"}, "response_cancel_not_active"),
    ({"type": "session.update", "session": {"input_audio_format": "g711_ulaw"}}, None),
])
def test_bad_events_get_error_events_and_the_session_keeps_serving(omni_single, event, code):
    async def body(client: Client) -> tuple[dict, dict]:
        await client.ws.send_str(event if isinstance(event, str) else json.dumps({**event, "event_id": "ev_1"}))
        error = await client.recv()
        await client.send("session.update", session={"voice": "chelsie", "modalities": ["text"]})
        return error, await client.recv()

    error, updated = session(omni_single, body)
    assert error["type"] == "error" and error["error"]["message"]
    assert error["error"]["type"] == "invalid_request_error"
    if code is not None:
        assert error["error"]["code"] == code
    if not isinstance(event, str):
        assert error["error"]["event_id"] == "ev_1"
    assert updated["type"] == "session.updated" and updated["session"]["modalities"] == ["text"]


@pytest.mark.parametrize("event, param, message", [
    ({"type": "session.update", "session": {"temperature": "warm"}}, "session.temperature",
     "session.temperature must be a number"),
    ({"type": "session.update", "session": {"max_response_output_tokens": 0}}, "session.max_response_output_tokens",
     "session.max_response_output_tokens must be a positive integer or 'inf'"),
    ({"type": "session.update", "session": "text only"}, "session", "session.update needs a 'session' object"),
    ({"type": "input_audio_buffer.append", "audio": 5}, "audio", "'audio' must be base64 pcm16"),
])
def test_an_event_field_of_the_wrong_kind_is_named_in_its_error(omni_single, event, param, message):
    """Each event's fields are read into its schema (schemas.py): the error names the field, with the
    client's event id, and the session's settings are as they were."""
    async def body(client: Client) -> tuple[dict, dict]:
        await client.ws.send_str(json.dumps({**event, "event_id": "ev_2"}))
        error = await client.recv()
        await client.send("session.update", session={"modalities": ["text"]})
        return error, await client.recv()

    error, updated = session(omni_single, body)
    assert error["type"] == "error", error
    assert (error["error"]["param"], error["error"]["message"], error["error"]["event_id"]) == (param, message, "ev_2")
    assert updated["session"]["temperature"] is None and updated["session"]["max_response_output_tokens"] == "inf"


def test_the_listen_task_is_refused_where_nothing_can_feed_its_stream(omni_single):
    status, body = http("POST", f"{omni_single.url}/v1/tasks/listen", {"inputs": []})
    assert status == 400 and body["error"]["code"] == "task_needs_stream"
    assert "user_audio" in body["error"]["message"] and "/v1/realtime" in body["error"]["message"]


def _frames(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    """(opcode, payload) of each unmasked frame the server sends (RFC 6455 section 5.2)."""
    buf = b""

    def take(n: int) -> bytes:
        nonlocal buf
        while len(buf) < n:
            more = sock.recv(65536)
            assert more, "the server closed the connection without a close frame"
            buf += more
        out, buf = buf[:n], buf[n:]
        return out
    while True:
        first, second = take(2)
        length = second & 0x7F
        if length >= 126:
            length = int.from_bytes(take(2 if length == 126 else 8), "big")
        yield first & 0x0F, take(length)


def test_a_message_over_the_cap_closes_the_socket_with_1009_and_the_server_keeps_serving(omni_single):
    """The WebSocket protocol's answer to a message over MAX_MESSAGE_BYTES (docs/serving.md states the cap).
    The client speaks RFC 6455 by hand and sends only the frame's header: the server refuses on the
    declared length, and a client still sending the 16 MiB would race the server's close (a reset)."""
    from runtime.entrypoints.http.realtime import MAX_MESSAGE_BYTES
    host, port = omni_single.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f"GET /v1/realtime HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        # FIN + text; masked, 64-bit length: one byte over the cap; the mask; no payload yet
        sock.sendall(bytes([0x81, 0x80 | 127]) + (MAX_MESSAGE_BYTES + 1).to_bytes(8, "big") + os.urandom(4))
        frames = _frames(sock)
        opcode, payload = next(frames)
        assert opcode == 0x1 and json.loads(payload)["type"] == "session.created"
        opcode, payload = next(frames)
        assert opcode == 0x8 and int.from_bytes(payload[:2], "big") == 1009, (opcode, payload)

    async def update(client: Client) -> dict:
        await client.send("session.update", session={"modalities": ["text"]})
        return await client.recv()
    assert session(omni_single, update)["type"] == "session.updated", "a new session is served"
