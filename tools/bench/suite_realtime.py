"""realtime: time from commit to the first audio delta on /v1/realtime, 1 s vs 6 s utterances; and with
server VAD, time from the end of speech to the first audio delta.

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

Server VAD (`turn_detection: {"type": "server_vad"}`, OpenAI's defaults: 500 ms of silence ends a turn):
a sentence spoken by espeak-ng (Debian's; the suite needs it), then silence, all paced at real time
until the first `response.audio.delta`; the client never commits. The end of speech is where the
server's `speech_stopped` says the silence began (`audio_end_ms`, a position in the audio), so its
wall time is the session's start plus that; the figure is the first audio's time less that, with the
silence the detector must hear (`silence_duration_ms`) included, and also given without it. Baseline,
in alternate rounds: the same speech with no silence after it, committed by the client at once (a
client that knows when the user stopped), timed from the commit.

A conversation: one session, 8 turns, each a 1 s utterance paced at real time, committed, answered with
speech (12 tokens) to its end; each turn timed from its commit to its first audio delta, and the thinker's
prefix-cache hit tokens counted per turn from /metrics (each turn's prompt is the whole conversation).
The row compares turn 8 with turn 1 of the same rounds: flat means the cache took the history.

Text streamed in to speech (an Orpheus tiny server, bench/text_in.py): an answer written a word at a time,
spoken over /v1/audio/speech/stream as it arrives, against the whole text POSTed to /v1/audio/speech once
written; first word to first audio.
"""
from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json
import subprocess
import time

import aiohttp
import numpy as np
import soundfile
import torch

from bench.registry import Context, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import LOWER, summarize
from bench import text_in
from bench.peer_mstar import compile_plan
from mstar_compiler.plan import load_plan
from runtime.streams.text_clauses import TextClauses
from runtime.entrypoints.http.audio_decode import resample
from runtime.entrypoints.http.audio_io import wav

PCM_RATE, CHUNK_S = 24000, 0.1
SECONDS = (1.0, 6.0)
WORKER_THREADS = 1
SENTENCE = "Hello there. What is the weather like in Paris today?"
SILENCE_MS = 500                       # server_vad's default silence_duration_ms
TURNS, TURN_S, TURN_TOKENS = 8, 1.0, 12


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


def spoken(text: str) -> bytes:
    """`text` read by espeak-ng, pcm16 at 24 kHz."""
    out = subprocess.run(["espeak-ng", "--stdout", text], check=True, capture_output=True).stdout
    wave, rate = soundfile.read(io.BytesIO(out), dtype="float32")
    wave = resample(torch.from_numpy(np.ascontiguousarray(wave)), rate, PCM_RATE)
    return (wave.clamp(-1, 1) * 32767).numpy().astype("<i2").tobytes()


async def _paced(ws: aiohttp.ClientWebSocketResponse, pcm: bytes, start: float, offset: int = 0) -> None:
    """Append `pcm` in 100 ms pieces at real time, its first sample due `offset` samples after `start`."""
    step = 2 * int(PCM_RATE * CHUNK_S)
    for i in range(0, len(pcm), step):
        await ws.send_str(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm[i: i + step]).decode()}))
        due = start + (offset + (i + step) // 2) / PCM_RATE
        await asyncio.sleep(max(0.0, due - time.monotonic()))


async def _session(url: str, seconds: float, seed: int, pcm: bytes | None = None) -> dict[str, float]:
    pcm = utterance(seconds, seed) if pcm is None else pcm
    async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "/v1/realtime") as ws:
        await _until(ws, "session.created")
        await ws.send_str(json.dumps({"type": "session.update", "session": {"temperature": 0}}))
        await _until(ws, "session.updated")
        await _paced(ws, pcm, time.monotonic())
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


async def _server_vad(url: str, speech: bytes) -> dict[str, float]:
    """Speech then silence at real time, the server deciding the turn: end of speech -> first audio delta."""
    async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "/v1/realtime") as ws:
        await _until(ws, "session.created")
        await ws.send_str(json.dumps({"type": "session.update", "session": {
            "temperature": 0, "turn_detection": {"type": "server_vad", "silence_duration_ms": SILENCE_MS}}}))
        await _until(ws, "session.updated")
        start = time.monotonic()
        silence = bytes(2 * PCM_RATE * 3)               # more than the turn needs; sending stops at the answer
        sending = asyncio.ensure_future(_paced(ws, speech + silence, start))
        stopped = await _until(ws, "input_audio_buffer.speech_stopped")
        await _until(ws, "response.audio.delta")
        first_audio = time.monotonic()
        sending.cancel()
        await ws.send_str(json.dumps({"type": "response.cancel"}))
        await _until(ws, "response.done")
    end_of_speech = start + stopped["audio_end_ms"] / 1000
    return {"first_audio": first_audio - end_of_speech, "audio_end_ms": stopped["audio_end_ms"]}


async def _conversation(url: str, seed: int) -> dict[str, float]:
    """Per turn: commit -> first audio delta, and the prefix cache's hit tokens during the turn. `seed`: new
    utterances for each run (nothing of an earlier run's conversation is in the cache)."""
    out: dict[str, float] = {}
    async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "/v1/realtime") as ws:
        await _until(ws, "session.created")
        await ws.send_str(json.dumps({"type": "session.update", "session": {
            "temperature": 0, "max_response_output_tokens": TURN_TOKENS}}))
        await _until(ws, "session.updated")
        for turn in range(1, TURNS + 1):
            hits = await _hit_tokens(http, url)
            await _paced(ws, utterance(TURN_S, seed * 100 + turn), time.monotonic())
            commit = time.monotonic()
            await ws.send_str(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send_str(json.dumps({"type": "response.create"}))
            await _until(ws, "response.audio.delta")
            out[f"turn{turn}_first_audio"] = time.monotonic() - commit
            await _until(ws, "response.done")
            out[f"turn{turn}_hit_tokens"] = await _hit_tokens(http, url) - hits
    return out


async def _hit_tokens(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("mstar_prefix_cache_hit_tokens_total"))


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
    speech = spoken(SENTENCE)
    ctx.settings.update(utterance_s=list(SECONDS), chunk_s=CHUNK_S, worker_threads=threads, vad_sentence=SENTENCE,
                        vad_speech_s=round(len(speech) / 2 / PCM_RATE, 2), vad_silence_duration_ms=SILENCE_MS,
                        baseline="none: absolute figures of this machine")
    plan = compile_plan(ctx.root / "graphs/qwen3_omni.yaml", ctx.root / "bench-results/plans/qwen3_omni-tiny-single.plan.bin",
                        "--preset", "tiny", "--placement", "single")
    log = ctx.root / "bench-results/logs/realtime-qwen3_omni.log"
    with mstar_run(plan, log, "mstar-run qwen3_omni tiny", threads) as srv:
        samples = {s: ctx.alternate(f"realtime {s:g} s utterance", {
            "realtime": lambda s=s: asyncio.run(_session(srv.url, s, int(s))),
            "file": lambda s=s: asyncio.run(_whole_file(srv.url, s, int(s)))}) for s in SECONDS}
        seeds = itertools.count(1)
        talk = ctx.alternate("an 8-turn conversation", {
            "conversation": lambda: asyncio.run(_conversation(srv.url, next(seeds)))})
        vad = ctx.alternate("server VAD, a spoken sentence", {
            "vad": lambda: asyncio.run(_server_vad(srv.url, speech)),
            "commit": lambda: asyncio.run(_session(srv.url, 0, 0, speech))})
    rows = _text_in(ctx, threads)
    label = "mstar-run qwen3_omni.yaml --preset tiny --placement single: /v1/realtime, commit to first audio delta"
    base = "the same server: the utterance as one WAV part of a streamed voice chat, POST to first audio chunk"
    note = f"100 ms appends paced at real time; random weights; torch threads per worker {threads}"
    for seconds, s in samples.items():
        case = f"Qwen3-Omni tiny, {seconds:g} s utterance"
        rows += [Row(case, "time to first audio after the user stops", "s", LOWER, Side(label, s["realtime"]["first_audio"]),
                     Side(base, s["file"]["first_audio"]), note=note, plot="realtime-first-audio", x=f"{seconds:g} s",
                     xlabel="utterance", names=("realtime", "whole file")),
                 Row(case, "commit to committed (tail encoded)", "s", LOWER, Side(label, s["realtime"]["committed"]),
                     names=("realtime", ""))]
    case = f"Qwen3-Omni tiny, server VAD, a {len(speech) / 2 / PCM_RATE:.1f} s spoken sentence (espeak-ng)"
    vad_label = "mstar-run qwen3_omni.yaml --preset tiny: /v1/realtime with server_vad, end of speech to first audio delta"
    commit_label = "the same server and speech, no VAD: the client commits at the end of the audio, commit to first audio"
    ends = vad["vad"]["audio_end_ms"]
    vad_note = (f"paced at real time; end of speech = speech_stopped's audio_end_ms ({min(ends):.0f}-{max(ends):.0f} ms "
                f"into the {len(speech) / 48:.0f} ms file: the client commit's clock starts after espeak's trailing "
                f"silence); silence_duration_ms {SILENCE_MS}")
    rows += [Row(case, "end of speech to first audio (the silence heard included)", "s", LOWER,
                 Side(vad_label, vad["vad"]["first_audio"]), Side(commit_label, vad["commit"]["first_audio"]),
                 note=vad_note, names=("server VAD", "client commit")),
             Row(case, "end of speech to first audio, less the silence heard", "s", LOWER,
                 Side(vad_label + f", less {SILENCE_MS} ms", [x - SILENCE_MS / 1000 for x in vad["vad"]["first_audio"]]),
                 Side(commit_label, vad["commit"]["first_audio"]), note=vad_note, names=("server VAD", "client commit"))]
    talked = talk["conversation"]
    turn_note = (f"one session, {TURNS} turns of {TURN_S:g} s utterances (100 ms appends at real time), spoken answers of "
                 f"{TURN_TOKENS} tokens; prefix-cache hit tokens per turn (median): "
                 + ", ".join(f"{sorted(talked[f'turn{t}_hit_tokens'])[len(talked[f'turn{t}_hit_tokens']) // 2]:.0f}"
                             for t in range(1, TURNS + 1)))
    rows.append(Row(f"Qwen3-Omni tiny, a {TURNS}-turn spoken conversation", "time to first audio after the commit", "s",
                    LOWER, Side(f"turn {TURNS} of the session", talked[f"turn{TURNS}_first_audio"]),
                    Side("turn 1 of the same session", talked["turn1_first_audio"]), note=turn_note,
                    names=(f"turn {TURNS}", "turn 1")))
    return rows


def _text_in(ctx: Context, threads: int) -> list[Row]:
    """Text streamed in to speech (bench/text_in.py) on an Orpheus tiny server."""
    plan = compile_plan(ctx.root / "graphs/orpheus.yaml", ctx.root / "bench-results/plans/orpheus-tiny-single.plan.bin",
                        "--preset", "tiny", "--placement", "single")
    clauses = TextClauses.of(load_plan(plan).task_streams[0].policy)
    count = len(clauses.append(text_in.TEXT) + clauses.finish())
    seeds = itertools.count(1)
    ctx.settings.update(text_in=text_in.TEXT, text_in_words_per_s=text_in.WORDS_PER_S, text_in_clauses=count)
    log = ctx.root / "bench-results/logs/realtime-orpheus.log"
    with mstar_run(plan, log, "mstar-run orpheus tiny", threads) as srv:
        model = asyncio.run(_model(srv.url))
        got = ctx.alternate("text streamed in to speech", {
            "streamed": lambda: asyncio.run(text_in.streamed(srv.url, next(seeds))),
            "whole": lambda: asyncio.run(text_in.whole(srv.url, model, count))})
    note = (f"a {len(text_in.TEXT.split())}-word answer written at {text_in.WORDS_PER_S:g} words/s, {count} clauses "
            f"under the graph's delimited policy, {text_in.MAX_TOKENS} audio tokens per clause on both sides (greedy); "
            f"first word to the end of the audio: streamed {summarize(got['streamed']['done']).median:.2f} s, "
            f"whole text {summarize(got['whole']['done']).median:.2f} s (medians)")
    return [Row("Orpheus tiny, text streamed in as an LLM writes it", "first word to first audio", "s", LOWER,
                Side("mstar-run orpheus.yaml --preset tiny: /v1/audio/speech/stream, a word per append",
                     got["streamed"]["first_audio"]),
                Side("the same server: the whole text POSTed to /v1/audio/speech (streamed) after its last word",
                     got["whole"]["first_audio"]), note=note, names=("streamed text", "whole text"))]
