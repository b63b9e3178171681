"""cascade: a spoken question's time from the end of the user's audio to the first audio of the answer,
graphs/voice_agent.yaml's `converse` cascade in one server against the same three models behind three
servers chained by a client that waits for each hop.

mstar: one `mstar-run` of graphs/voice_agent.yaml (preset `smollm2`: the Qwen3-Omni recogniser tiny,
SmolLM2-135M-Instruct's published weights in fp32, Orpheus tiny), under its default placement `split`
(Orpheus on a rank of its own, the others on rank 0) and under `single` (all on one rank: each
worker step runs the LLM's and the voice's batches in turn); the question is one streamed
POST /v1/chat/completions (the audio as an `input_audio` part, `modalities: ["text", "audio"]`), and
the clock runs from the POST (the user has stopped: the whole audio is there) to the first audio chunk.
The server transcribes, SmolLM2 answers, and each clause of the answer is spoken as soon as it is written.

Baseline: the same three graphs and presets, each its own `mstar-run` (qwen3_omni tiny, smollm2
fp32, orpheus tiny; the same seeded weights, the same tokenizers), chained as a client framework does
without streaming text: POST /v1/audio/transcriptions to the recogniser, then the transcript (after the
typed words) as the user's turn of a non-streamed chat to SmolLM2, then the whole answer POSTed to
/v1/audio/speech (streamed PCM); the clock runs from the first POST to the first audio byte.

Both sides: greedy text (temperature 0, `max_tokens` MAX_TOKENS for the answer); Orpheus with the same
seed (the cascade's clause i seed + i); 1 and CONCURRENT conversations at once, each round's figure the
median over its conversations. The two sides' servers run on the same machine, idle while the other
side measures; client and servers share its cores.
"""
from __future__ import annotations

import asyncio
import base64
import math
import time

import aiohttp
import torch

from bench.openai_load import sse_json
from bench.peer_mstar import compile_plan
from bench.registry import Context, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import LOWER, summarize
from runtime.entrypoints.http.audio_io import pcm16, wav

ASK = "Tell me about the sea."            # typed before the audio (the tiny recogniser hears noise)
SYSTEM = "Answer in two short sentences."
MAX_TOKENS = 64
CONCURRENT = 4
SEED = 7
LLM, TTS, AGENT = "smollm2-135m-instruct", "orpheus-3b", "voice-agent"


def _wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 330 Hz tone as a WAV file (16-bit mono)."""
    return wav(pcm16(0.18 * torch.sin(2 * math.pi * 330 * torch.arange(int(seconds * rate)) / rate)), rate)


AUDIO = _wav()


async def _converse(http: aiohttp.ClientSession, url: str) -> float:
    """One question to the one-server cascade: seconds from the POST to the first audio chunk."""
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(AUDIO).decode(), "format": "wav"}}
    body = {"model": AGENT, "modalities": ["text", "audio"], "audio": {"voice": "tara", "format": "pcm16"},
            "stream": True, "max_tokens": MAX_TOKENS, "temperature": 0.0, "seed": SEED,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": [{"type": "text", "text": ASK}, part]}]}
    start = time.perf_counter()
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for event in sse_json(resp):
            if "error" in event:
                raise RuntimeError(f"cascade error: {event['error']}")
            audio = event["choices"][0]["delta"].get("audio", {}) if event.get("choices") else {}
            if audio.get("data"):
                return time.perf_counter() - start
    raise RuntimeError("the cascade's answer carried no audio")


async def _chained(http: aiohttp.ClientSession, asr: str, llm: str, tts: str, asr_model: str) -> float:
    """The same question through three servers, each hop awaited: seconds to the first audio byte."""
    start = time.perf_counter()
    form = aiohttp.FormData()
    form.add_field("file", AUDIO, filename="q.wav", content_type="audio/wav")
    form.add_field("model", asr_model)
    form.add_field("temperature", "0")
    async with http.post(asr + "/v1/audio/transcriptions", data=form) as resp:
        resp.raise_for_status()
        heard = (await resp.json())["text"]
    chat = {"model": LLM, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": " ".join(t for t in (ASK, heard) if t)}]}
    async with http.post(llm + "/v1/chat/completions", json=chat) as resp:
        resp.raise_for_status()
        answer = (await resp.json())["choices"][0]["message"]["content"]
    speech = {"model": TTS, "input": answer, "voice": "tara", "response_format": "pcm", "stream": True, "seed": SEED}
    async with http.post(tts + "/v1/audio/speech", json=speech) as resp:
        resp.raise_for_status()
        async for chunk in resp.content.iter_any():
            if chunk:
                return time.perf_counter() - start
    raise RuntimeError("the chained speech carried no audio")


async def _median_of(make, n: int) -> dict[str, float]:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        times = await asyncio.gather(*(make(http) for _ in range(n)))
    return {"first_audio": summarize(times).median}


@register("cascade", "a spoken question, end of audio to first answer audio: one-server cascade vs chained servers")
def run(ctx: Context) -> list[Row]:
    root, plans = ctx.root, ctx.root / "bench-results/plans"
    agent_plan = compile_plan(root / "graphs/voice_agent.yaml", plans / "voice_agent-smollm2-split.plan.bin",
                              "--placement", "split")
    single_plan = compile_plan(root / "graphs/voice_agent.yaml", plans / "voice_agent-smollm2-single.plan.bin",
                               "--placement", "single")
    asr_plan = compile_plan(root / "graphs/qwen3_omni.yaml", plans / "qwen3_omni-tiny-single.plan.bin",
                            "--preset", "tiny")
    llm_plan = compile_plan(root / "graphs/smollm2.yaml", plans / "smollm2-135m-fp32.plan.bin",
                            "--preset", "smollm2-135m")
    tts_plan = compile_plan(root / "graphs/orpheus.yaml", plans / "orpheus-tiny-single.plan.bin", "--preset", "tiny")
    ctx.settings.update(ask=ASK, system=SYSTEM, max_tokens=MAX_TOKENS, audio_s=1.0, concurrent=[1, CONCURRENT],
                        threads=ctx.threads, agent_preset="smollm2")
    logs = root / "bench-results/logs"
    with mstar_run(agent_plan, logs / "cascade-agent.log", "mstar-run voice_agent", ctx.threads) as agent, \
            mstar_run(single_plan, logs / "cascade-single.log", "mstar-run voice_agent single", ctx.threads) as one, \
            mstar_run(asr_plan, logs / "cascade-asr.log", "mstar-run qwen3_omni tiny", ctx.threads) as asr, \
            mstar_run(llm_plan, logs / "cascade-llm.log", "mstar-run smollm2", ctx.threads) as llm, \
            mstar_run(tts_plan, logs / "cascade-tts.log", "mstar-run orpheus tiny", ctx.threads) as tts:
        asr_model = "qwen3-omni-30b-a3b"
        got = {n: ctx.alternate(f"cascade, {n} at once", {
            "cascade": lambda n=n: asyncio.run(_median_of(lambda h: _converse(h, agent.url), n)),
            "one rank": lambda n=n: asyncio.run(_median_of(lambda h: _converse(h, one.url), n)),
            "chained": lambda n=n: asyncio.run(_median_of(lambda h: _chained(h, asr.url, llm.url, tts.url, asr_model),
                                                          n))}) for n in (1, CONCURRENT)}
    note = (f"a 1 s question (a tone: the tiny recogniser hears noise) after the typed words {ASK!r}; SmolLM2 fp32 "
            f"answers greedily in at most {MAX_TOKENS} tokens; Orpheus tiny speaks (seed {SEED})")
    chained = "three mstar-run servers (qwen3_omni, smollm2, orpheus) chained by a client awaiting each hop"
    rows = []
    for n, s in got.items():
        case = f"voice agent, {n} conversation{'s' if n > 1 else ''} at once"
        rows += [Row(case, "end of audio to first answer audio", "s", LOWER,
                     Side("mstar-run voice_agent.yaml (placement split): the converse cascade, each clause spoken "
                          "as it is written", s["cascade"]["first_audio"]),
                     Side(chained, s["chained"]["first_audio"]), note=note, plot="cascade-first-audio", x=n,
                     xlabel="conversations at once", names=("one-server cascade", "chained servers")),
                 Row(case + ", the cascade on one rank", "end of audio to first answer audio", "s", LOWER,
                     Side("mstar-run voice_agent.yaml --placement single: the same cascade, every model on rank 0",
                          s["one rank"]["first_audio"]),
                     Side(chained, s["chained"]["first_audio"]), note=note,
                     names=("one-server cascade, one rank", "chained servers"))]
    return rows
