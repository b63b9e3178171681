"""A worker killed under streamed speech (Orpheus tiny, real `mstar-run`, the official `openai`
client): a raw PCM stream is aborted with no terminating chunk, so the client raises instead of
taking the cut audio for a whole answer; an SSE stream ends with an error event."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import http.client as http_client

import openai
import pytest

from tests.runtime.serving.conftest import http
from tests.runtime.serving.speech.conftest import ORPHEUS, serve


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory, "orpheus")


def stream_pcm(server, started: threading.Event, outcome: dict, key: int) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    body = {"seed": key, "max_tokens": 4000, "stream": True}
    try:
        with client.audio.speech.with_streaming_response.create(
                model=ORPHEUS, voice="tara", input="A long story.", response_format="pcm", extra_body=body) as resp:
            for _ in resp.iter_bytes():
                started.set()
        outcome[key] = "clean end"
    except Exception as exc:   # whatever the client's transport raises for a cut chunked body
        outcome[key] = f"raised {type(exc).__name__}"


def kill_worker(server) -> None:
    os.kill(http("GET", f"{server.url}/health")[1]["worker_pids"]["0"], signal.SIGKILL)


def wait_healthy(server, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while http("GET", f"{server.url}/health")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)


def test_killed_worker_aborts_raw_audio_streams(server) -> None:
    started = [threading.Event() for _ in range(4)]
    outcome: dict = {}
    threads = [threading.Thread(target=stream_pcm, args=(server, s, outcome, i)) for i, s in enumerate(started)]
    [t.start() for t in threads]
    assert all(s.wait(60) for s in started)
    kill_worker(server)
    [t.join(60) for t in threads]
    assert outcome == {i: outcome[i] for i in range(4)} and all(v.startswith("raised") for v in outcome.values()), \
        outcome
    wait_healthy(server)


def test_killed_worker_ends_an_sse_stream_with_an_error_event(server) -> None:
    wait_healthy(server)
    body = {"model": ORPHEUS, "voice": "tara", "input": "A long story.", "seed": 3, "max_tokens": 4000,
            "stream": True, "stream_format": "sse"}
    events: list[dict] = []
    conn = http_client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    conn.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    for line in resp:
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
            if len(events) == 1:
                kill_worker(server)
    conn.close()
    assert events[0]["type"] == "speech.audio.delta"
    assert "error" in events[-1] and "died" in events[-1]["error"]["message"]
    wait_healthy(server)
