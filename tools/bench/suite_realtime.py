"""realtime: time from commit to the first audio delta on /v1/realtime, 1 s vs 6 s utterances.

One real `mstar-run` of graphs/qwen3_omni.yaml (preset `tiny`, placement `single`, random
weights). Per round and utterance length, a session streams the utterance (a tone over noise,
pcm16 at 24 kHz) in 100 ms appends paced at real time, so the audio encoder hears each
complete window while the "user" still speaks; then `input_audio_buffer.commit` and
`response.create` are sent back to back and the clock runs to the first `response.audio.delta`
(the response is then cancelled). Also recorded: commit to `input_audio_buffer.committed`
(the tail window's encoding). The tiny encoder attends in 2 s windows, so the commit encodes at
most 2 s whatever the utterance's length; the thinker's prompt still grows with it (13 rows a
second). A plain measurement (no baseline); client and server share the machine's cores.
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
from bench.suite_chat import compile_plan

PCM_RATE, CHUNK_S = 24000, 0.1
SECONDS = (1.0, 6.0)
WORKER_THREADS = 1


def utterance(seconds: float, seed: int) -> bytes:
    t = np.arange(int(PCM_RATE * seconds)) / PCM_RATE
    wave = 0.3 * np.sin(2 * np.pi * (300 + 200 * t) * t) + 0.05 * np.random.default_rng(seed).standard_normal(t.shape)
    return (np.clip(wave, -1, 1) * 32767).astype("<i2").tobytes()


async def _until(ws: aiohttp.ClientWebSocketResponse, event_type: str) -> dict:
    """The next event of `event_type` (waits for that type only: a byte-tokenizer answer may send its
    first transcript delta after its first audio)."""
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


@register("realtime", "/v1/realtime: commit to first audio delta, 1 s vs 6 s utterances (Qwen3-Omni tiny)")
def run(ctx: Context) -> list[Row]:
    threads = ctx.threads or WORKER_THREADS
    ctx.settings.update(utterance_s=list(SECONDS), chunk_s=CHUNK_S, worker_threads=threads,
                        baseline="none: absolute figures of this machine")
    plan = compile_plan(ctx.root / "graphs/qwen3_omni.yaml", ctx.root / "bench-results/plans/qwen3_omni-tiny-single.plan.bin",
                        "--preset", "tiny", "--placement", "single")
    log = ctx.root / "bench-results/logs/realtime-qwen3_omni.log"
    with mstar_run(plan, log, "mstar-run qwen3_omni tiny", threads) as srv:
        sides = {f"{s:g} s": (lambda s=s: asyncio.run(_session(srv.url, s, int(s)))) for s in SECONDS}
        samples = ctx.alternate("realtime 1 s vs 6 s", sides)
    label = "mstar-run qwen3_omni.yaml --preset tiny --placement single, one session at a time"
    note = f"100 ms appends paced at real time; random weights; torch threads per worker {threads}"
    rows = []
    for side, s in samples.items():
        case = f"Qwen3-Omni tiny, {side} utterance"
        rows += [Row(case, "commit to first audio delta", "s", LOWER, Side(label, s["first_audio"]), note=note,
                     plot="realtime-first-audio", x=side, xlabel="utterance", names=("mstar", "")),
                 Row(case, "commit to committed (tail encoded)", "s", LOWER, Side(label, s["committed"]),
                     names=("mstar", ""))]
    return rows
