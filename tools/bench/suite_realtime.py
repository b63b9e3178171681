"""realtime: time from commit to the first audio delta on /v1/realtime, 1 s vs 6 s utterances.

One real `mstar-run` of graphs/qwen3_omni.yaml (preset `tiny`, placement `single`, random
weights). Per round and utterance length, a session streams the utterance (a tone over noise,
pcm16 at 24 kHz) in 100 ms appends paced at real time, so the audio encoder hears each
complete window while the "user" still speaks; then `input_audio_buffer.commit` and
`response.create` are sent back to back and the clock runs to the first `response.audio.delta`
(the response is then cancelled). Also recorded: commit to `input_audio_buffer.committed`
(the tail window's encoding). The tiny encoder attends in 2 s windows, so the commit encodes at
most 2 s whatever the utterance's length; the thinker's prompt still grows with it (13 rows a
second). Baseline: the same utterance sent whole once spoken, as a WAV `input_audio` part of a
streamed voice chat (POST /v1/chat/completions, modalities text + audio), timed from the POST to
its first audio chunk: everything is encoded after the user stopped. Client and server share the
machine's cores. Both decode greedily: the same rows give the same answer, so both sides do the
same work after the user stops.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time

import aiohttp
import numpy as np

from bench.registry import Context, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import LOWER
from bench.peer_mstar import compile_plan
from runtime.entrypoints.http.audio_io import wav

PCM_RATE, CHUNK_S = 24000, 0.1
SECONDS = (1.0, 6.0)
WORKER_THREADS = 1


def utterance(seconds: float, seed: int) -> bytes:
    t = np.arange(int(PCM_RATE * seconds)) / PCM_RATE
    wave = 0.3 * np.sin(2 * np.pi * (300 + 200 * t) * t) + 0.05 * np.random.default_rng(seed).standard_normal(t.shape)
    return (np.clip(wave, -1, 1) * 32767).astype("<i2").tobytes()


async def _until(ws: aiohttp.ClientWebSocketResponse, event_type: str) -> dict:
    """The next event of `event_type` (the ones before it are read and dropped)."""
    while True:
        event = json.loads((await ws.receive(timeout=120)).data)
        if event["type"] == "error":
            raise RuntimeError(f"the server sent an error event: {event['error']}")
        if event["type"] == event_type:
            return event


async def _session(url: str, seconds: float, seed: int) -> dict[str, float]:
    pcm, step = utterance(seconds, seed), 2 * int(PCM_RATE * CHUNK_S)
    async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "/v1/realtime") as ws:
        await _until(ws, "session.created")
        await ws.send_str(json.dumps({"type": "session.update", "session": {"temperature": 0}}))
        await _until(ws, "session.updated")
        start = time.monotonic()
        for k, i in enumerate(range(0, len(pcm), step)):
            await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm[i: i + step]).decode()}))
            await asyncio.sleep(max(0.0, start + (k + 1) * CHUNK_S - time.monotonic()))   # real-time pacing
        commit = time.monotonic()
        await ws.send_str(json.dumps({"type": "input_audio_buffer.commit"}))
        await ws.send_str(json.dumps({"type": "response.create"}))
        await _until(ws, "input_audio_buffer.committed")
        committed = time.monotonic()
        await _until(ws, "response.audio.delta")
        first_audio = time.monotonic()
        await ws.send_str(json.dumps({"type": "response.cancel"}))
        await _until(ws, "response.done")
    return {"first_audio": first_audio - commit, "committed": committed - commit}


async def _whole_file(url: str, seconds: float, seed: int) -> dict[str, float]:
    """POST the utterance as one WAV part of a streamed voice chat; seconds to its first audio chunk."""
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(utterance(seconds, seed), PCM_RATE))
                                                   .decode(), "format": "wav"}}
    body = {"model": await _model(url), "messages": [{"role": "user", "content": [part]}], "stream": True, "temperature": 0,
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
    async with aiohttp.ClientSession() as http:
        start = time.monotonic()
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {") and b'"data"' in line:
                    return {"first_audio": time.monotonic() - start}
    raise RuntimeError("the voice chat sent no audio")


async def _model(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(url + "/v1/models") as resp:
        return (await resp.json())["data"][0]["id"]


@register("realtime", "/v1/realtime: commit to first audio delta, 1 s vs 6 s utterances (Qwen3-Omni tiny)")
def run(ctx: Context) -> list[Row]:
    threads = ctx.threads or WORKER_THREADS
    ctx.settings.update(utterance_s=list(SECONDS), chunk_s=CHUNK_S, worker_threads=threads,
                        baseline="none: absolute figures of this machine")
    plan = compile_plan(ctx.root / "graphs/qwen3_omni.yaml", ctx.root / "bench-results/plans/qwen3_omni-tiny-single.plan.bin",
                        "--preset", "tiny", "--placement", "single")
    log = ctx.root / "bench-results/logs/realtime-qwen3_omni.log"
    with mstar_run(plan, log, "mstar-run qwen3_omni tiny", threads) as srv:
        samples = {s: ctx.alternate(f"realtime {s:g} s utterance", {
            "realtime": lambda s=s: asyncio.run(_session(srv.url, s, int(s))),
            "file": lambda s=s: asyncio.run(_whole_file(srv.url, s, int(s)))}) for s in SECONDS}
    label = "mstar-run qwen3_omni.yaml --preset tiny --placement single: /v1/realtime, commit to first audio delta"
    base = "the same server: the utterance as one WAV part of a streamed voice chat, POST to first audio chunk"
    note = f"100 ms appends paced at real time; random weights; torch threads per worker {threads}"
    rows = []
    for seconds, s in samples.items():
        case = f"Qwen3-Omni tiny, {seconds:g} s utterance"
        rows += [Row(case, "time to first audio after the user stops", "s", LOWER, Side(label, s["realtime"]["first_audio"]),
                     Side(base, s["file"]["first_audio"]), note=note, plot="realtime-first-audio", x=f"{seconds:g} s",
                     xlabel="utterance", names=("realtime", "whole file")),
                 Row(case, "commit to committed (tail encoded)", "s", LOWER, Side(label, s["realtime"]["committed"]),
                     names=("realtime", ""))]
    return rows
