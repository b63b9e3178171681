"""orpheus-3b: Orpheus-3B TTS at its published shapes, mstar-run vs vLLM CPU + SNAC in the client vs llama.cpp + SNAC.

Every side serves the same weights (bench.orpheus_3b_weights: Llama-3.2-3B shapes, vocabulary 156,940, bf16,
seeded; SNAC 24 kHz whole): mstar-run serves graphs/orpheus.yaml's `orpheus-3b` preset with `--weights` on
them and streams `/v1/audio/speech` (SNAC decodes each 28-token window on the server, batched across streams);
the peers serve the LM alone, vLLM's CPU build from the safetensors and llama.cpp's `llama-server` (built for
this CPU) from the bf16 GGUF its own converter makes of them, and the client decodes as `orpheus-speech` does
with vLLM (bench.orpheus_client: SNAC in the client process, a window every 7 tokens from the 28th).

One measurement of a side starts its server alone (three 3B servers do not fit 24 GiB together), sends one
warm-up stream, then bursts of 1, 4 and 16 concurrent streams (quick: 1 and 4), each stream a fresh prompt (a
nonce first: nothing any side cached helps it) of `MAX_TOKENS` audio tokens (`ignore_eos` on the peers; mstar's
streams are checked to run the full length), temperature 0.6 and top-p 0.8 (Orpheus' defaults), prefix caches
off on every side and shown so by each side's counters; then stops it. Sides run in ABBA order, rounds
alternated. Per concurrency: median time to first audio, RTF (burst wall time / the audio seconds a stream's
tokens encode, the same on every side), audio seconds per wall second (the same audio), and playback
continuity by vLLM-Omni's definition (a simulated player per stream starts at its first chunk; a gap over
0.1 s is an underrun). Each side's start to ready and its largest process' peak RSS are rows too. The random
weights make the LM emit audio tokens as a trained Orpheus does (bench.orpheus_3b_weights).

What differs by design and is said in the labels: mstar computes the LM head on the 4,096 columns of the
position's SNAC slot (+ end of speech) and samples among them (a trained Orpheus puts its mass there); the
peers compute the whole head and sample the whole vocabulary, and their client folds a token that is not an
audio token of its slot to a code (random weights; the count is recorded) so that they do the SNAC work of a
trained model's stream. mstar's SNAC runs in the plan's bf16 without its noise blocks' random noise; the
client's runs the `snac` package as shipped (fp32, noise on). mstar emits the first frame and the tail frames
(keep_edges); the client, like orpheus-speech, neither: the audio each delivers is in the rows' notes.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Callable

from bench import cache_state
from bench.cache_state import COLD, CacheMismatch
from bench.orpheus_3b_weights import Orpheus3B, ensure
from bench.orpheus_client import SnacClient, client_burst, request
from bench.peer_llamacpp import Weights, llamacpp_peer, native_missing
from bench.peer_mstar import compile_plan, kv_bytes, started_peer
from bench.peer_vllm import vllm_peer
from bench.peers import Peer, measured
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.speech_load import SAMPLE_RATE, SpeechBurst, listener_metrics, speech_burst
from bench.stats import HIGHER, LOWER
from runtime.launch.server import peak_rss

CONCURRENCY, QUICK_CONCURRENCY = (1, 4, 16), (1, 4)
MAX_TOKENS, QUICK_MAX_TOKENS = 112, 42           # 16 frames (1.37 s of audio) / 6 frames
WARMUP_TOKENS = 35
SAMPLING = {"temperature": 0.6, "top_p": 0.8}
VOICE = "tara"
DEVICE_MEMORY = "8GiB"                           # 6.2 GiB of weights, the rest KV: ample for 16 streams
MIN_GAP_S = 0.1                                  # vLLM-Omni's underrun
TOKENS_PER_FRAME, SAMPLES_PER_FRAME = 7, 2048
TEXTS = ("The sun rose slowly over the quiet harbour.", "Please leave your message after the tone.",
         "Turn left at the second traffic light.", "The museum opens at nine on weekdays.",
         "Our train is running about ten minutes late.", "She packed three books for the long flight.",
         "Thunderstorms are expected later this evening.", "The recipe needs two cups of flour.",
         "He tuned the old piano before the concert.", "Remember to water the plants on Friday.",
         "The library will be closed for the holiday.", "A small boat drifted toward the island.",
         "Your order has been shipped and will arrive soon.", "The children built a castle out of sand.",
         "Coffee tastes better on a cold morning.", "The meeting has moved to the third floor.")
METRICS = (("ttfa", "median time to first audio", "s", LOWER), ("rtf", "RTF (wall / audio seconds)", "x", LOWER),
           ("audio_per_s", "audio seconds per wall second", "s/s", HIGHER),
           ("underrun_streams", "streams with an underrun (gap > 0.1 s)", "streams", LOWER),
           ("underrun_s", "total underrun", "s", LOWER))
SERVER_METRICS = (("start_s", "start to ready (weights cached by the OS)", "s"),
                  ("peak_rss_gib", "peak RSS of its largest process", "GiB"))
SERVER_NOTE = ("from the server command to its health check answering, then VmHWM after every burst; each side "
               "started alone; the client's SNAC is not counted")
LABELS = {"mstar": ("mstar-run, graphs/orpheus.yaml orpheus-3b preset (bf16, LM head on the slot's 4,096 columns), "
                    "--weights on the suite's checkpoint, SNAC on the server (bf16, batched)"),
          "vllm": "same Orpheus-3B-shaped bf16 safetensors; SNAC 24 kHz in the client (snac package, fp32)",
          "llamacpp": "SNAC 24 kHz in the client (snac package, fp32)"}
PAIRS = (("mstar", "vllm"), ("mstar", "llamacpp"))


class Prompts:
    """Fresh texts per burst: a nonce first, so no side has any of a burst's prompts cached."""

    def __init__(self) -> None:
        self.bursts = 0

    def next(self, n: int) -> list[str]:
        self.bursts += 1
        return [f"[{self.bursts}.{i}] {TEXTS[i % len(TEXTS)]}" for i in range(n)]


def encoded_s(tokens: int) -> float:
    """Seconds of audio `tokens` audio tokens encode: whole frames of 7, 2048 samples each at 24 kHz."""
    return tokens // TOKENS_PER_FRAME * SAMPLES_PER_FRAME / SAMPLE_RATE


def burst_metrics(burst: SpeechBurst, n: int) -> dict[str, float]:
    """One burst's figures, keyed `<metric>_<n>`. RTF and audio per wall second count the audio the streams'
    tokens encode, the same on every side; what each side delivers of it (mstar every frame, the
    orpheus-speech client all but the first and the last two) is `audio_s`, the median per stream."""
    heard = listener_metrics(burst, SAMPLE_RATE, MIN_GAP_S)
    audio = sum(encoded_s(s.output_tokens) for s in burst.streams)
    m = {"ttfa": heard["ttfa"], "rtf": burst.wall_s / (audio / len(burst.streams)), "audio_per_s": audio / burst.wall_s,
         "underrun_streams": heard["underrun_streams"], "underrun_s": heard["underrun_s"],
         "audio_s": heard["median_audio_s"]}
    return {f"{k}_{n}": v for k, v in m.items()}


def _check_lengths(name: str, burst: SpeechBurst, want: int) -> None:
    got = [s.output_tokens for s in burst.streams]
    if any(t != want for t in got):
        raise Needs(f"{name} to run every stream to {want} audio tokens; got {got}")


class Served:
    """One side's measurement: start its server alone, warm up, run every burst, stop it."""

    def __init__(self, ctx: Context, name: str, start: Callable[[contextlib.ExitStack], Peer],
                 burst: Callable[[Peer, list[str], int], tuple[SpeechBurst, int]]) -> None:
        self.ctx, self.name, self.start, self.burst = ctx, name, start, burst
        self.prompts, self.record = Prompts(), {}
        self.tokens = QUICK_MAX_TOKENS if ctx.quick else MAX_TOKENS

    def __call__(self) -> dict[str, float]:
        with contextlib.ExitStack() as stack:
            t0 = time.perf_counter()
            peer = self.start(stack)
            started = time.perf_counter() - t0
            self.record = peer.record()
            self.burst(peer, self.prompts.next(1), WARMUP_TOKENS)
            out = measured(peer.counters, lambda: self._bursts(peer))()
            return {"start_s": started, "peak_rss_gib": peak_rss(peer.server.proc.pid) / 2**30, **out}

    def _bursts(self, peer: Peer) -> dict[str, float]:
        out: dict[str, float] = {}
        for n in (QUICK_CONCURRENCY if self.ctx.quick else CONCURRENCY):
            burst, folded = self.burst(peer, self.prompts.next(n), self.tokens)
            _check_lengths(self.name, burst, self.tokens)
            out.update(burst_metrics(burst, n), **{f"folded_{n}": float(folded)})
        return out


def _mstar(ctx: Context, files: Orpheus3B, plan: Path, kv: int) -> Served:
    flags = ["--weights", str(files.root), "--no-prefix-cache"]

    def start(stack: contextlib.ExitStack) -> Peer:
        srv = stack.enter_context(mstar_run(plan, ctx.root / "bench-results/logs/mstar-orpheus-3b.log",
                                            "mstar-run (orpheus-3b)", ctx.threads, *flags))
        return started_peer(srv, LABELS["mstar"], flags, ctx.threads, kv)

    def burst(peer: Peer, texts: list[str], tokens: int) -> tuple[SpeechBurst, int]:
        bodies = [{"model": peer.model, "voice": VOICE, "input": t, "max_tokens": tokens, "seed": i, **SAMPLING}
                  for i, t in enumerate(texts)]
        return speech_burst(peer.server.url, bodies), 0
    return Served(ctx, "mstar", start, burst)


def _client_burst(server: str, tokenizer, snac: SnacClient) -> Callable[[Peer, list[str], int], tuple[SpeechBurst, int]]:
    from runtime.models.orpheus.serving import orpheus_prompt

    def burst(peer: Peer, texts: list[str], tokens: int) -> tuple[SpeechBurst, int]:
        bodies = [request(server, orpheus_prompt(tokenizer, VOICE, t), tokens, peer.model, i, SAMPLING)
                  for i, t in enumerate(texts)]
        return client_burst(peer.server.url, server, bodies, snac)
    return burst


def _peers(ctx: Context, files: Orpheus3B, kv: int, slots: int) -> dict[str, Served]:
    from runtime.text.loading import load_tokenizer

    tokenizer, snac = load_tokenizer(files.lm), SnacClient(files.snac)
    vllm = Served(ctx, "vllm", lambda stack: vllm_peer(ctx, stack, "bfloat16", COLD, kv, max_model_len=1024,
                                                     model=files.lm, name="orpheus-3b", weights=LABELS["vllm"]),
                _client_burst("vllm", tokenizer, snac))
    llamacpp = Served(ctx, "llamacpp", lambda stack: llamacpp_peer(
        ctx, stack, "bfloat16", COLD, slots, kv, model=Weights("bf16", files.gguf, "bf16"),
        config=files.lm / "config.json", name="orpheus-3b"), _client_burst("llamacpp", tokenizer, snac))
    return {"vllm": vllm, "llamacpp": llamacpp}


def _rows(ctx: Context, samples: dict, sides: dict[str, Served], tokens: int) -> list[Row]:
    labels = {name: side.record["label"] + (f"; {LABELS['llamacpp']}" if name == "llamacpp" else "")
              for name, side in sides.items()}
    states = cache_state.side_states({name: side.record for name, side in sides.items()}, samples, ctx.settings)
    rows = []
    for a, b in PAIRS:
        case = f"{a} vs {b}"
        try:
            cache_state.require_same(case, COLD, {a: states[a], b: states[b]})
        except CacheMismatch as exc:
            ctx.record_needs(case, exc)
            continue
        for key, metric, unit in SERVER_METRICS:
            rows.append(Row("Orpheus-3B, the server", metric, unit, LOWER, Side(labels[a], samples[a][key]),
                            Side(labels[b], samples[b][key]), names=(a, b), note=SERVER_NOTE))
        for n in (QUICK_CONCURRENCY if ctx.quick else CONCURRENCY):
            audio = {side: statistics.median(samples[side][f"audio_s_{n}"]) for side in (a, b)}
            note = (f"{n} concurrent stream(s) of {tokens} audio tokens; audio delivered per stream (median) "
                    f"{audio[a]:.2f} s ({a}) / {audio[b]:.2f} s ({b}); {b}'s client folded "
                    f"{sum(samples[b][f'folded_{n}']):.0f} tokens to codes over the rounds")
            for key, metric, unit, better in METRICS:
                rows.append(Row(f"Orpheus-3B, {n} stream{'s' * (n > 1)}", metric, unit, better,
                                Side(labels[a], samples[a][f"{key}_{n}"]), Side(labels[b], samples[b][f"{key}_{n}"]),
                                names=(a, b), plot=f"{b}-{key}", x=n, xlabel="concurrent streams", note=note))
    return rows


@register("orpheus-3b", "Orpheus-3B TTS at its published shapes: mstar-run vs vLLM CPU + SNAC in the client vs "
                        "llama.cpp's server + SNAC in the client, 1 / 4 / 16 streams")
def run(ctx: Context) -> list[Row]:
    import torch

    files = ensure(ctx)
    with contextlib.suppress(Needs):
        if missing := native_missing(ctx):
            ctx.record_needs("llama.cpp built for this CPU", missing)
    plan = compile_plan(ctx.root / "graphs/orpheus.yaml", ctx.root / "bench-results/plans/orpheus-3b-bench.plan.bin",
                        "--preset", "orpheus-3b", "--device-memory", DEVICE_MEMORY)
    kv = kv_bytes(plan)         # every side's KV budget: mstar's plan pool
    concurrency = QUICK_CONCURRENCY if ctx.quick else CONCURRENCY
    sides = {"mstar": _mstar(ctx, files, plan, kv), **_peers(ctx, files, kv, max(concurrency))}
    tokens = QUICK_MAX_TOKENS if ctx.quick else MAX_TOKENS
    ctx.settings.update(max_tokens=tokens, concurrency=list(concurrency), sampling=SAMPLING, voice=VOICE,
                        device_memory=DEVICE_MEMORY, weights=str(files.root), min_gap_s=MIN_GAP_S,
                        kv_budget_bytes=kv, client_snac_torch_threads=torch.get_num_threads())
    samples = ctx.alternate("orpheus-3b", sides, warmup=0)
    ctx.settings["sides"] = {name: side.record for name, side in sides.items()}
    return _rows(ctx, samples, sides, tokens)
