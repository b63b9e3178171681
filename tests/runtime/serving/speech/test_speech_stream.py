"""/v1/audio/speech/stream on real `mstar-run` servers (Orpheus tiny, Qwen3-Omni tiny): text written in
pieces, cut by the graph's `delimited` policy, each clause spoken by the speech task, audio in clause order.

What the tests prove comes from what was sent and what the server said, never from a clock: the first
clause's audio is received *before* the rest of the text is sent (the test waits for it), so the first
audio chunk left the server while the text was unfinished.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from typing import Any, Awaitable, Callable

import aiohttp
import numpy as np
import pytest

from mstar_compiler.plan import load_plan
from runtime.entrypoints.http.speech_model import speech_model
from runtime.entrypoints.http.speech_stream import text_stream
from runtime.launch.server import compile_plan
from tests.runtime.serving.speech.conftest import ORPHEUS, serve

CLAUSES = "mstar_speech_stream_clauses_total"
RUNNING = "mstar_running_requests"


@pytest.fixture(scope="module")
def orpheus(tmp_path_factory):
    yield from serve(tmp_path_factory, "orpheus")


class Socket:
    """One /v1/audio/speech/stream session: send events, read the server's in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, event_type: str, **fields: Any) -> None:
        await self.ws.send_str(json.dumps({"type": event_type, **fields}))

    async def recv(self) -> dict:
        msg = await self.ws.receive(timeout=120)      # liveness only: a server that never answers fails here
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        return json.loads(msg.data)

    async def until(self, event_type: str) -> list[dict]:
        seen = [await self.recv()]
        while seen[-1]["type"] != event_type:
            seen.append(await self.recv())
        return seen


def stream(server, body: Callable[[Socket], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with aiohttp.ClientSession() as http, \
                http.ws_connect(f"{server.url.replace('http', 'ws')}/v1/audio/speech/stream") as ws:
            socket = Socket(ws)
            created = await socket.recv()
            assert created["type"] == "session.created"
            return await body(socket)
    return asyncio.run(run())


def audio_of(events: list[dict]) -> dict[int, bytes]:
    """Each clause's pcm16, in the order the deltas came."""
    out: dict[int, bytes] = {}
    for e in events:
        if e["type"] == "speech.audio.delta":
            out[e["clause"]] = out.get(e["clause"], b"") + base64.b64decode(e["delta"])
    return out


def speech(server, text: str, **settings: Any) -> bytes:
    """The same text through POST /v1/audio/speech (the oracle: one request, no stream)."""
    body = json.dumps({"model": ORPHEUS, "input": text, "response_format": "pcm", **settings}).encode()
    req = urllib.request.Request(f"{server.url}/v1/audio/speech", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read()


def test_the_first_clause_speaks_before_the_text_is_finished_and_each_clause_is_its_own_speech(orpheus) -> None:
    settings = {"voice": "tara", "seed": 11, "max_tokens": 35}
    first, rest = "Hello there, my good friend. How", " are you today? I hope well"

    async def body(socket: Socket) -> tuple[list[dict], float, list[dict]]:
        await socket.send("session.update", session=settings)
        await socket.until("session.updated")
        await socket.send("input_text.append", delta=first)
        before = await socket.until("speech.audio.delta")     # the rest of the text is not sent yet
        clauses_then = orpheus.metric(CLAUSES)
        await socket.send("input_text.append", delta=rest)
        await socket.send("input_text.done")
        return before, clauses_then, await socket.until("speech.done")

    clauses_before = orpheus.metric(CLAUSES)
    before, clauses_then, after = stream(orpheus, body)
    events = before + after
    released = [e for e in events if e["type"] == "speech.clause"]
    # min 12 characters, "," and "." end a clause when a space follows: "Hello there," is the first
    assert [e["text"] for e in released] == ["Hello there,", " my good friend.", " How are you today?", " I hope well"]
    assert "".join(e["text"] for e in released) == first + rest
    assert clauses_then - clauses_before == 2          # what the server had released when the first audio left
    assert before[-1]["clause"] == 0
    kinds = [(e["type"], e.get("clause")) for e in events if e["type"].startswith("speech.")]
    done_at = [kinds.index(("speech.clause.done", i)) for i in range(4)]
    assert done_at == sorted(done_at)                  # clause order
    for i in range(4):                                 # no clause's audio after the next one's starts
        deltas = [k for k, (t, c) in enumerate(kinds) if t == "speech.audio.delta" and c == i]
        assert deltas and max(deltas) < done_at[i] and (i == 0 or min(deltas) > done_at[i - 1])
    assert after[-1]["usage"]["clauses"] == 4 and after[-1]["usage"]["input_characters"] == len(first + rest)
    assert orpheus.metric(CLAUSES) - clauses_before == 4
    # each clause is exactly the speech of its text alone: the speech task with the clause's seed (seed + i).
    # Samples may differ by the last bit where the clauses batch together and the oracle runs alone
    # (fp32 sums in another order, ~1e-6 relative): 2 LSB of 16-bit PCM.
    heard = audio_of(events)
    for e in released:
        alone = np.frombuffer(speech(orpheus, e["text"].strip(), voice="tara", seed=11 + e["clause"],
                                     max_tokens=35), "<i2").astype(np.int32)
        got = np.frombuffer(heard[e["clause"]], "<i2").astype(np.int32)
        assert got.shape == alone.shape and np.abs(got - alone).max() <= 2, e


def test_flush_speaks_a_fragment_and_the_session_takes_a_second_text(orpheus) -> None:
    async def body(socket: Socket) -> list[dict]:
        await socket.send("input_text.append", delta="no delimiter in this one")
        await socket.send("input_text.flush")
        first = await socket.until("speech.clause.done")
        await socket.send("input_text.done")
        first += await socket.until("speech.done")
        await socket.send("input_text.append", delta="A second text.")
        await socket.send("input_text.done")
        return first + await socket.until("speech.done")

    events = stream(orpheus, body)
    released = [(e["clause"], e["text"]) for e in events if e["type"] == "speech.clause"]
    assert released == [(0, "no delimiter in this one"), (1, "A second text.")]
    usages = [e["usage"] for e in events if e["type"] == "speech.done"]
    assert [u["clauses"] for u in usages] == [1, 1] and usages[1]["input_characters"] == len("A second text.")
    assert all(e["finish_reason"] != "error" for e in events if e["type"] == "speech.clause.done")


def test_bad_events_get_error_events_and_the_session_goes_on(orpheus) -> None:
    async def body(socket: Socket) -> list[dict]:
        out = []
        await socket.ws.send_bytes(b"\x00")
        out.append(await socket.recv())
        await socket.ws.send_str("{not json")
        out.append(await socket.recv())
        await socket.send("input_audio_buffer.append", audio="")
        out.append(await socket.recv())
        await socket.send("session.update", session={"voice": "nobody"})
        out.append(await socket.recv())
        await socket.send("session.update", session={"temperature": 9.0})
        out.append(await socket.recv())
        await socket.send("session.update", session={"speed": 2})
        out.append(await socket.recv())
        await socket.send("input_text.append", delta=7)
        out.append(await socket.recv())
        await socket.send("input_text.append", delta="x" * 70000)
        out.append(await socket.recv())
        await socket.send("input_text.append", delta="Still speaking after all that.")
        await socket.send("input_text.done")
        return out + await socket.until("speech.done")

    events = stream(orpheus, body)
    errors = [e["error"] for e in events[:8]]
    assert all(e["type"] == "error" for e in events[:8])
    assert [e["code"] for e in errors] == ["invalid_event", "invalid_json", "unknown_event", None, None, None, None,
                                           "too_much_text"]
    assert [e["param"] for e in errors[3:]] == ["session.voice", "temperature", "session", "delta", "delta"]
    assert "nobody" in errors[3]["message"] and "70000" in errors[7]["message"]
    spoken = [e for e in events[8:] if e["type"] == "speech.clause"]
    assert [e["text"] for e in spoken] == ["Still speaking after all that."]
    assert events[-1]["usage"]["clauses"] == 1


def test_closing_the_socket_aborts_the_clauses_it_left(orpheus) -> None:
    async def body(socket: Socket) -> None:
        await socket.send("session.update", session={"max_tokens": 70})
        await socket.send("input_text.append", delta="One clause here. Two clauses here. Three clauses here. ")
        await socket.until("speech.audio.delta")

    stream(orpheus, body)              # the socket closes with clauses queued and speaking

    def settled() -> tuple[float, float, float]:
        return (orpheus.metric(RUNNING), orpheus.metric('mstar_worker_kv_used_blocks{node="lm",rank="0"}'),
                orpheus.metric("mstar_speech_stream_sessions"))
    deadline = time.monotonic() + 60   # liveness only: the workers report their KV on their heartbeats
    while settled() != (0, 0, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert settled() == (0, 0, 0)      # no request running, no KV block held, no session open


def test_the_qwen3_omni_talker_speaks_streamed_text(omni_single) -> None:
    async def body(socket: Socket) -> list[dict]:
        await socket.send("session.update", session={"voice": "Ethan", "max_tokens": 4, "max_audio_frames": 30})
        await socket.until("session.updated")
        await socket.send("input_text.append", delta="Tell me a story, ")
        first = await socket.until("speech.audio.delta")
        await socket.send("input_text.append", delta="a short one.")
        await socket.send("input_text.done")
        return first + await socket.until("speech.done")

    events = stream(omni_single, body)
    assert [e["text"] for e in events if e["type"] == "speech.clause"] == ["Tell me a story,", " a short one."]
    heard = audio_of(events)
    assert sorted(heard) == [0, 1] and all(len(pcm) > 0 for pcm in heard.values())
    assert events[-1]["usage"]["clauses"] == 2 and events[-1]["usage"]["audio_seconds"] > 0


@pytest.mark.parametrize("graph, task", [("orpheus", "speech"), ("qwen3_omni", "voice_chat"), ("vjepa2_ac", None),
                                         ("smollm2", None)])
def test_the_route_is_served_where_the_graph_streams_text_into_its_speech_task(tmp_path, graph, task) -> None:
    plan = load_plan(compile_plan(tmp_path, graph, preset="tiny"))
    found = text_stream(plan, speech_model(plan))
    assert (found.task if found else None) == task
    if found:
        assert found.policy.kind == "delimited" and found.policy.delimiters[:3] == [".", "!", "?"]
