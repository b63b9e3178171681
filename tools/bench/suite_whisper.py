"""whisper: Whisper transcriptions, mstar-run's /v1/audio/transcriptions vs transformers' Whisper generate.

Both sides run the same weights: transformers' `WhisperForConditionalGeneration` at whisper-base's shapes
(6 + 6 layers, width 512, its published 51,865-token vocabulary), seeded random, its special-token
embedding rows scaled down so that neither side stops early (bench.whisper_reference): every window
decodes exactly MAX_TOKENS text tokens on both sides, greedily, fp32. mstar-run serves graphs/whisper.yaml's
large-v3 mapping at base dims from the model's tensors written in the published layout (`--weights ROOT`),
its windows' max_tokens set to MAX_TOKENS, and answers the `openai` client's transcriptions (language
given, json); N requests are sent at once. The reference side does what transformers' ASR pipeline does
with `batch_size=N` in this process: WhisperFeatureExtractor, then one `generate` over the N windows
(static batching: the batch runs until its longest row is done). Before timing, mstar's transcript of every
clip is checked equal to transformers' of that clip alone (its batched run may break a near tie otherwise:
the row's note counts those). Figures: seconds for N transcriptions of 10 s clips sent at once, N = 1 and 8;
and the mean latency of 8 transcriptions arriving ARRIVAL_S apart: mstar-run takes each as it comes (its
decoder steps join those running), the reference batches whatever has arrived each time it is free (a
queue in front of the pipeline that batches: transformers' generate cannot add a request to a running
batch), its clock simulated from each batch's measured time.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import urllib.request

import yaml

from bench.peer_mstar import compile_plan
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import LOWER

CONCURRENCY, QUICK_CONCURRENCY = (1, 8), (1, 2)
MAX_TOKENS = 96           # text tokens per window on both sides
SECONDS = 10.0
ARRIVAL_S, ARRIVALS = 1.0, 8
RATE = 16000
MSTAR = ("mstar-run /v1/audio/transcriptions (graphs/whisper.yaml at whisper-base dims, fp32): encoder once per "
         "window, decoder steps of concurrent requests batched over a paged KV holding the cross-attention memory")
REFERENCE = ("transformers 5.25 WhisperForConditionalGeneration.generate, fp32, in process: WhisperFeatureExtractor "
             "then one generate over the N clips (what pipeline('automatic-speech-recognition', batch_size=N) runs)")


def _dims() -> dict:
    from mstar_compiler.catalogue.whisper import PRESETS
    return dict(PRESETS["base"])


def _write(ctx: Context):
    """The reference model, its published-layout directory under ROOT, and the bench graph."""
    import torch
    from safetensors.torch import save_file

    from bench import whisper_reference as ref

    dims = _dims()
    hf = ref.model(dims)
    root = ctx.root / "bench-results/weights/whisper-base-random"
    repo = root / "whisper-large-v3"
    tokenizer = ref.write_tokenizer(repo, dims["num_languages"], dims["text_vocab_size"])
    save_file({k: v.contiguous() for k, v in hf.state_dict().items() if k != "proj_out.weight"},
              str(repo / "model.safetensors"))
    hf.config.to_json_file(str(repo / "config.json"))
    data = yaml.safe_load((ctx.root / "graphs/whisper.yaml").read_text())
    base = data["presets"]["base"]
    data["presets"]["bench-base"] = {**base, "random_weights": False, "weights": data["presets"]["large-v3"]["weights"],
                                     "params": {"max_tokens": MAX_TOKENS}}
    graph = ctx.root / "bench-results/plans/whisper-bench.yaml"
    graph.parent.mkdir(parents=True, exist_ok=True)
    graph.write_text(yaml.safe_dump(data, sort_keys=False))
    torch.set_grad_enabled(False)
    return hf, tokenizer, root, graph


def _clips(n: int):
    import numpy as np
    out = []
    for i in range(n):
        g = np.random.default_rng(100 + i)
        t = np.arange(int(SECONDS * RATE)) / RATE
        out.append((0.3 * np.sin(2 * np.pi * (200 + 90 * i) * t * (1 + 0.1 * t))
                    + 0.05 * g.standard_normal(t.size)).astype(np.float32))
    return out


def _wav(samples) -> io.BytesIO:
    import soundfile
    buf = io.BytesIO()
    soundfile.write(buf, samples, RATE, format="WAV", subtype="FLOAT")
    buf.seek(0)
    buf.name = "clip.wav"
    return buf


def _mstar(url: str, model: str, clips) -> list[str]:
    import openai

    async def all_at_once() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
        answers = await asyncio.gather(*(client.audio.transcriptions.create(model=model, file=_wav(c), language="en")
                                         for c in clips))
        return [a.text for a in answers]
    return asyncio.run(all_at_once())


def _reference(hf, tokenizer, extractor, clips) -> list[str]:
    from bench import whisper_reference as ref
    features = extractor(clips, sampling_rate=RATE, return_tensors="pt").input_features
    text = _dims()["text_vocab_size"]
    return [tokenizer.decode([t for t in row if t < text])
            for row in ref.generate(hf, features, "en", "transcribe", MAX_TOKENS)]


def _mstar_arrivals(url: str, model: str, clips) -> dict[str, float]:
    """Clip i sent at i * ARRIVAL_S: the mean seconds from its arrival to its answer."""
    import openai

    async def staggered() -> list[float]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=3600)
        start = time.perf_counter()

        async def one(i: int, clip) -> float:
            await asyncio.sleep(i * ARRIVAL_S)
            await client.audio.transcriptions.create(model=model, file=_wav(clip), language="en")
            return time.perf_counter() - start - i * ARRIVAL_S
        return await asyncio.gather(*(one(i, c) for i, c in enumerate(clips)))
    waits = asyncio.run(staggered())
    return {"latency": sum(waits) / len(waits)}


def _reference_arrivals(hf, tokenizer, extractor, clips) -> dict[str, float]:
    """The same arrivals served by a queue that batches every arrived clip each time the model is free."""
    now, done, waits = 0.0, 0, []
    while done < len(clips):
        now = max(now, done * ARRIVAL_S)                  # idle: the next clip arrives
        ready = [i for i in range(done, len(clips)) if i * ARRIVAL_S <= now]
        start = time.perf_counter()
        _reference(hf, tokenizer, extractor, [clips[i] for i in ready])
        now += time.perf_counter() - start
        waits += [now - i * ARRIVAL_S for i in ready]
        done += len(ready)
    return {"latency": sum(waits) / len(waits)}


def _timed(fn) -> dict[str, float]:
    start = time.perf_counter()
    fn()
    return {"time": time.perf_counter() - start}


@register("whisper", "Whisper (base shapes) transcriptions: mstar-run vs transformers' generate, 1 and 8 at once")
def run(ctx: Context) -> list[Row]:
    try:
        import torch
        from transformers import WhisperFeatureExtractor
    except ImportError as exc:
        raise Needs(f"transformers' Whisper: {exc}") from exc
    hf, tokenizer, root, graph = _write(ctx)
    extractor = WhisperFeatureExtractor(feature_size=_dims()["num_mel_bins"])
    plan = compile_plan(graph, ctx.root / "bench-results/plans/whisper-base.plan.bin", "--preset", "bench-base")
    levels = QUICK_CONCURRENCY if ctx.quick else CONCURRENCY
    ctx.settings.update(concurrency=list(levels), arrivals=ARRIVALS, arrival_s=ARRIVAL_S, max_tokens=MAX_TOKENS,
                        clip_seconds=SECONDS, dims="whisper-base",
                        dtype="fp32", reference_torch_threads=torch.get_num_threads(), weights=str(root))
    rows = []
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(mstar_run(plan, ctx.root / "bench-results/logs/mstar-whisper.log",
                                            "mstar-run (whisper base)", ctx.threads, "--weights", str(root)))
        with urllib.request.urlopen(srv.url + "/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        for n in levels:
            clips = _clips(n)
            mine = _mstar(srv.url, model, clips)
            alone = [_reference(hf, tokenizer, extractor, [c])[0] for c in clips]
            if mine != alone:
                raise AssertionError(f"N={n}: mstar's transcripts differ from transformers' of each clip alone")
            batched = _reference(hf, tokenizer, extractor, clips)
            flips = sum(a != b for a, b in zip(alone, batched))
            samples = ctx.alternate(f"whisper N={n}", {
                "mstar": lambda: _timed(lambda: _mstar(srv.url, model, clips)),
                "transformers": lambda: _timed(lambda: _reference(hf, tokenizer, extractor, clips)),
            }, warmup=0)    # the agreement check ran both once
            rows.append(Row(f"whisper-base {n} at once", f"time for {n} transcriptions", "s", LOWER,
                            Side(MSTAR, samples["mstar"]["time"]), Side(REFERENCE, samples["transformers"]["time"]),
                            None, plot="whisper-time-vs-concurrency", x=n, xlabel="transcriptions at once",
                            note=f"{SECONDS:g} s clips, {MAX_TOKENS} text tokens each on both sides (greedy, "
                                 f"fp32); mstar's transcripts equal transformers' of each clip alone"
                                 + (f"; transformers' batch of {n} writes {flips} of them otherwise than alone (a "
                                    f"near tie its batched fp32 sums break the other way)" if flips else "")))
        clips = _clips(ARRIVALS)
        samples = ctx.alternate(f"whisper arrivals every {ARRIVAL_S:g} s", {
            "mstar": lambda: _mstar_arrivals(srv.url, model, clips),
            "transformers": lambda: _reference_arrivals(hf, tokenizer, extractor, clips),
        }, warmup=0)
        rows.append(Row(f"whisper-base {ARRIVALS} arriving {ARRIVAL_S:g} s apart", "mean latency", "s", LOWER,
                        Side(MSTAR, samples["mstar"]["latency"]),
                        Side(REFERENCE + "; a queue batching every arrived clip when free (its clock simulated "
                             "from measured batch times)", samples["transformers"]["latency"]), None,
                        note=f"{SECONDS:g} s clips, {MAX_TOKENS} text tokens each, greedy fp32; the same "
                             f"transcripts as the rows above"))
    return rows

