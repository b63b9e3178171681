"""/v1/realtime against a real Qwen3-Omni tiny server: the OpenAI Realtime core events over a real WebSocket.

The client is aiohttp's WebSocket client; the server is the package's shared `omni_single`
(no server start of its own). Heard windows are read from /metrics: the tiny encoder attends
in 2 s windows, so a 3 s utterance streamed in 100 ms chunks has one window heard before the
commit and the 1 s tail at it.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import aiohttp
import pytest

from tests.runtime.models.qwen3_omni.test_audio_stream import chunks, utterance

WINDOWS = 'mstar_realtime_audio_windows_total{phase="%s"}'
KV_NODES = ("thinker", "talker")


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
    deadline = time.monotonic() + 20            # heartbeats carry the workers' view: give them a few beats
    while time.monotonic() < deadline and (_kv(server) or server.metric('mstar_stream_buffers{where="workers"}')):
        time.sleep(0.2)


def test_streamed_utterance_is_heard_while_spoken_and_answered_in_speech(omni_single):
    server = omni_single
    before = {p: server.metric(WINDOWS % p) or 0 for p in ("streamed", "commit")}

    async def body(client: Client) -> list[dict]:
        await client.send("session.update", session={"instructions": "Answer briefly.", "voice": "ethan",
                                                     "modalities": ["audio", "text"]})
        assert (await client.recv())["type"] == "session.updated"
        await client.speak(utterance(3.0))
        await asyncio.sleep(0.5)     # the window is heard while the client is still to commit
        streamed_before_commit = server.metric(WINDOWS % "streamed")
        await client.send("input_audio_buffer.commit")
        committed = await client.until("conversation.item.created")
        await client.send("response.create")
        events = await client.until("response.done")
        return [{"streamed_before_commit": streamed_before_commit}, *committed, *events]

    head, *events = session(server, body)
    types = [e["type"] for e in events]
    assert types[:2] == ["input_audio_buffer.committed", "conversation.item.created"]
    assert "response.created" in types and types[-1] == "response.done"
    assert events[-1]["response"]["status"] == "completed"
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.audio_transcript.delta")
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.audio.delta")
    assert transcript and len(audio) > 0 and len(audio) % 2 == 0
    assert events[-1]["response"]["output"][0]["content"][0]["transcript"] == transcript
    assert head["streamed_before_commit"] - before["streamed"] == 1           # 3 s: one 2 s window before commit
    assert server.metric(WINDOWS % "commit") - before["commit"] == 1          # and the tail at it
    _wait_freed(server)
    assert _kv(server) == 0


def test_cancel_mid_answer_stops_the_deltas_and_frees_kv(omni_single):
    server = omni_single

    async def body(client: Client) -> tuple[list[dict], list[dict]]:
        await client.speak(utterance(1.0, seed=1))
        await client.send("input_audio_buffer.commit")
        await client.until("conversation.item.created")
        await client.send("response.create")
        first = await client.until("response.audio_transcript.delta")
        await client.send("response.cancel")
        rest = await client.until("response.done")
        # after the cancel's response.done nothing more of that response comes
        await client.send("input_audio_buffer.clear")
        after = await client.until("input_audio_buffer.cleared")
        return first + rest, after

    events, after = session(server, body)
    assert events[-1]["type"] == "response.done" and events[-1]["response"]["status"] == "cancelled"
    assert [e["type"] for e in after] == ["input_audio_buffer.cleared"]
    _wait_freed(server)
    assert _kv(server) == 0
    assert server.metric('mstar_stream_buffers{where="workers"}') == 0
    assert server.metric('mstar_stream_buffers{where="conductor"}') == 0
    assert (server.metric("mstar_realtime_responses_cancelled_total") or 0) >= 1


@pytest.mark.parametrize("event, code", [
    ("not json", "invalid_json"),
    ({"type": "no.such.event"}, "unknown_event"),
    ({"type": "input_audio_buffer.append", "audio": "%%%"}, "invalid_audio"),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
    ({"type": "response.create"}, "no_committed_audio"),
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
