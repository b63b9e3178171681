"""omni-wide: Qwen3-Omni-30B-A3B at full width (4 of the thinker's 48 layers, 4 of the talker's 20), mstar-run vs
transformers' Qwen3OmniMoeForConditionalGeneration.generate, text and text + speech, 1 and 8 concurrent.

Both sides read the same repository (bench.omni_wide_weights: the published layout at graphs/qwen3_omni.yaml's
`omni-wide` cut, bf16, seeded): mstar-run serves the preset with `--weights` and streams `/v1/chat/completions`
(text; and `modalities: ["text", "audio"]`, pcm16, for speech); transformers runs in a process of its own
(bench.omni_hf) as its README runs the model, in bf16 with sdpa attention, `generate` on one static batch of
every request of a burst (transformers batches statically: a burst is one call, every request returns when the
batch ends, and the audio comes when `generate` returns: that is its time to first audio).

One measurement of a side starts it alone (two 10 GiB models do not fit 24 GiB together), runs one warm-up
burst of each kind, then bursts of 1 and 8 concurrent requests of each kind (quick: 1 and 2), every request a
fresh prompt of one length (two nonce words first), greedy, exactly `TEXT_TOKENS` (text) or `SPEECH_TOKENS`
thinker tokens (`ignore_eos`; transformers' min = max new tokens) and, with speech, `FRAMES` codec frames
(mstar's `max_audio_frames`; transformers' talker min = max new tokens) from a greedy talker, voice Ethan.
mstar's prefix cache is off (its counters show it); transformers keeps nothing across calls. Rows: time to first
text token (TTFT), time per output token after it (TPOT: (last - first token time) / (tokens - 1), per request),
text tokens per second over the burst, time to first audio (TTFA), RTF (burst wall time / audio seconds per
stream), audio seconds per wall second, start to ready and peak RSS of the side's process.

What differs by design and is said in the notes: transformers' token times come from a `generate` streamer in
its process, mstar's from SSE chunks at the client (HTTP and detokenising are on mstar's side of the clock).
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import cache_state
from bench.cache_state import COLD, CacheMismatch
from bench.line_process import LineProcess
from bench.omni_wide_weights import OmniWide, ensure, plan_dims
from bench.openai_load import ChatJob, chat_burst
from bench.peer_mstar import compile_plan, kv_bytes, started_peer
from bench.peers import measured, no_cache, node_run_s
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.speech_load import SAMPLE_RATE, SpeechBurst, audio_chat_burst, listener_metrics
from bench.stats import HIGHER, LOWER
from runtime.launch.server import peak_rss

CONCURRENCY, QUICK_CONCURRENCY = (1, 8), (1, 2)
TEXT_TOKENS, SPEECH_TOKENS, FRAMES = 32, 16, 50          # FRAMES: 4.0 s of speech at 12.5 Hz
QUICK_TEXT_TOKENS, QUICK_FRAMES = 8, 26
SAMPLES_PER_FRAME = 1920
VOICE = "ethan"
SENTENCE = "describe the harbour at dawn for a listener who cannot see it ."
NONCES = 64
TEXT_METRICS = (("ttft", "median time to first token", "s", LOWER), ("tpot", "median time per output token", "s",
                LOWER), ("tok_s", "text tokens per second", "tok/s", HIGHER))
SPEECH_METRICS = (("ttft", "median time to first token", "s", LOWER), ("ttfa", "median time to first audio", "s",
                  LOWER), ("rtf", "RTF (wall / audio seconds per stream)", "x", LOWER),
                  ("audio_per_s", "audio seconds per wall second", "s/s", HIGHER))
SPEECH_NODES = ("thinker", "talker", "code_predictor", "code2wav")
SERVER_METRICS = (("start_s", "start to ready (weights cached by the OS)", "s"),
                  ("peak_rss_gib", "peak RSS of its process", "GiB"))
LABELS = {"mstar": "mstar-run, graphs/qwen3_omni.yaml omni-wide preset (bf16), --weights on the suite's repository",
          "transformers": ("transformers 5.25 Qwen3OmniMoeForConditionalGeneration.generate, bf16, sdpa, one static "
                           "batch per burst, the same repository")}


def prompt_text(burst: int, i: int) -> str:
    """Request i of burst `burst`: one length every time, two nonce words first (nothing cached helps)."""
    return f"Request n{burst % NONCES} n{i % NONCES} : {SENTENCE}"


def prompt_words() -> list[str]:
    return ["Request", ":", *SENTENCE.split(), *(f"n{k}" for k in range(NONCES))]


class OmniSide:
    """One side's measurement: start alone, warm up, every burst, stop."""

    def __init__(self, ctx: Context, name: str) -> None:
        self.ctx, self.name, self.bursts, self.record = ctx, name, 0, {}
        self.tokens = QUICK_TEXT_TOKENS if ctx.quick else TEXT_TOKENS
        self.frames = QUICK_FRAMES if ctx.quick else FRAMES

    def texts(self, n: int) -> list[str]:
        self.bursts += 1
        return [prompt_text(self.bursts, i) for i in range(n)]

    def __call__(self) -> dict[str, float]:
        with contextlib.ExitStack() as stack:
            t0 = time.perf_counter()
            self.start(stack)
            out = {"start_s": time.perf_counter() - t0}
            self.text(self.texts(1), 4)
            self.speech(self.texts(1), 4, 2)
            run = measured(self.counters, lambda: self._bursts())
            out.update(run())
            out["peak_rss_gib"] = peak_rss(self.pid) / 2**30
            return out

    def _bursts(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for n in (QUICK_CONCURRENCY if self.ctx.quick else CONCURRENCY):
            out.update({f"text_{k}_{n}": v for k, v in self.text(self.texts(n), self.tokens).items()})
            got = self.speech(self.texts(n), SPEECH_TOKENS, self.frames)
            out.update({f"speech_{k}_{n}": v for k, v in got.items()})
        return out


def _speech_metrics(wall: float, ttfts: list[float], ttfas: list[float], samples: list[int]) -> dict[str, float]:
    audio = sum(samples) / SAMPLE_RATE
    return {"ttft": statistics.median(ttfts), "ttfa": statistics.median(ttfas), "rtf": wall / (audio / len(samples)),
            "audio_per_s": audio / wall, "frames": min(samples) / SAMPLES_PER_FRAME}


class Mstar(OmniSide):
    def __init__(self, ctx: Context, plan: Path, files: OmniWide) -> None:
        super().__init__(ctx, "mstar")
        self.plan, self.files, self.flags = plan, files, ["--weights", str(files.root), "--no-prefix-cache"]

    def start(self, stack: contextlib.ExitStack) -> None:
        srv = stack.enter_context(mstar_run(self.plan, self.ctx.root / "bench-results/logs/mstar-omni-wide.log",
                                            "mstar-run (omni-wide)", self.ctx.threads, *self.flags))
        self.peer = started_peer(srv, LABELS["mstar"], self.flags, self.ctx.threads, kv_bytes(self.plan))
        self.record, self.pid, self.counters = self.peer.record(), srv.proc.pid, self.peer.counters

    def text(self, texts: list[str], tokens: int) -> dict[str, float]:
        got = chat_burst(self.peer.server.url, self.peer.model, [ChatJob(t, tokens) for t in texts])
        if any(c != tokens for c in got.completion_tokens):
            raise Needs(f"mstar to write {tokens} tokens per request; got {got.completion_tokens}")
        tpots = [(e - f) / (tokens - 1) for e, f in zip(got.e2e_s, got.ttft_s)]
        return {"ttft": statistics.median(got.ttft_s), "tpot": statistics.median(tpots),
                "tok_s": sum(got.completion_tokens) / got.wall_s}

    def speech(self, texts: list[str], tokens: int, frames: int) -> dict[str, float]:
        bodies = [{"model": self.peer.model, "messages": [{"role": "user", "content": t}], "audio": {"voice": VOICE},
                   "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0, "max_audio_frames": frames}
                  for t in texts]
        before = self.node_s()
        burst, ttfts = audio_chat_burst(self.peer.server.url, bodies)
        spent = {f"node_s_{node}": seconds - before[node] for node, seconds in self.node_s().items()}
        return _speech_metrics(burst.wall_s, ttfts, [s.first_audio_s for s in burst.streams],
                               [s.samples for s in burst.streams]) | _underruns(burst) | spent

    def node_s(self) -> dict[str, float]:
        return node_run_s(self.peer.server.url, SPEECH_NODES)


def _underruns(burst: SpeechBurst) -> dict[str, float]:
    return {"underrun_streams": listener_metrics(burst, SAMPLE_RATE, 0.1)["underrun_streams"]}


class Transformers(OmniSide):
    def __init__(self, ctx: Context, plan: Path, files: OmniWide) -> None:
        super().__init__(ctx, "transformers")
        from runtime.models.qwen3_omni.serving import omni_prompt
        from runtime.text.loading import load_tokenizer

        tokenizer, dims = load_tokenizer(files.repo), plan_dims(plan)["talker"]
        # the ids mstar-run makes of the same messages: the same tokenizer file through the same code
        self.ids = lambda text: omni_prompt(tokenizer, dims, [{"role": "user", "content": text}])
        self.files, self.counters = files, no_cache

    def start(self, stack: contextlib.ExitStack) -> None:
        cmd = [sys.executable, str(Path(__file__).with_name("omni_hf.py")), str(self.files.repo)]
        if self.ctx.threads:
            cmd += ["--threads", str(self.ctx.threads)]
        self.process = LineProcess(stack, cmd, self.ctx.root / "bench-results/logs/transformers-omni-wide.log",
                                   "transformers' Qwen3-Omni process")
        ready = self.process.ask()
        self.pid = self.process.pid
        self.record = {"label": LABELS["transformers"], "cache_enabled": False,
                       "cache_source": "transformers keeps nothing across generate calls", "torch_threads":
                       ready["threads"], "binding": "none", "attention": "sdpa", "dtype": "bfloat16"}

    def _run(self, texts: list[str], tokens: int, frames: int | None) -> dict[str, Any]:
        request = {"prompts": [self.ids(t) for t in texts], "tokens": tokens}
        got = self.process.ask(request if frames is None else {**request, "frames": frames})
        if any(t != tokens for t in got["tokens"]):
            raise Needs(f"transformers to write {tokens} tokens per request; got {got['tokens']}")
        return got

    def text(self, texts: list[str], tokens: int) -> dict[str, float]:
        got = self._run(texts, tokens, None)
        times = got["token_times"]           # [prompt, step 1, ..., step n]: the whole batch's steps
        return {"ttft": times[1], "tpot": (times[-1] - times[1]) / (tokens - 1),
                "tok_s": tokens * len(texts) / got["wall"]}

    def speech(self, texts: list[str], tokens: int, frames: int) -> dict[str, float]:
        got = self._run(texts, tokens, frames)
        wall = got["wall"]
        return _speech_metrics(wall, [got["token_times"][1]] * len(texts), [wall] * len(texts), got["samples"]) | {
            "underrun_streams": 0.0}   # its audio arrives whole: nothing plays before it


def _rows(ctx: Context, samples: dict, sides: dict[str, OmniSide]) -> list[Row]:
    states = cache_state.side_states({name: side.record for name, side in sides.items()}, samples, ctx.settings)
    try:
        cache_state.require_same("mstar vs transformers", COLD, states)
    except CacheMismatch as exc:
        ctx.record_needs("mstar vs transformers", exc)
        return []
    a, b = samples["mstar"], samples["transformers"]
    la, lb = sides["mstar"].record["label"], sides["transformers"].record["label"]
    rows = [Row("Qwen3-Omni wide, the server", metric, unit, LOWER, Side(la, a[key]), Side(lb, b[key]),
                names=("mstar", "transformers"), note="each side started alone; transformers in its own process; "
                                                               "mstar's peak is its worker's, its largest process")
            for key, metric, unit in SERVER_METRICS]
    side = sides["mstar"]
    for n in (QUICK_CONCURRENCY if ctx.quick else CONCURRENCY):
        note = (f"{n} concurrent request(s), {side.tokens} text tokens each; transformers: one static batch, token "
                "times from a generate streamer in its process; mstar: SSE chunks at the client")
        for key, metric, unit, better in TEXT_METRICS:
            rows.append(Row(f"Qwen3-Omni wide text, {n} concurrent", metric, unit, better,
                            Side(la, a[f"text_{key}_{n}"]), Side(lb, b[f"text_{key}_{n}"]),
                            names=("mstar", "transformers"), plot=f"text-{key}", x=n, xlabel="concurrent requests",
                            note=note))
        frames = {s: min(samples[s][f"speech_frames_{n}"]) for s in ("mstar", "transformers")}
        note = (f"{n} concurrent request(s), {SPEECH_TOKENS} text tokens and {side.frames} codec frames asked; least "
                f"frames delivered {frames['mstar']:.1f} (mstar) / {frames['transformers']:.1f} (transformers); "
                f"mstar streams with an underrun (gap > 0.1 s) over the rounds: "
                f"{sum(a[f'speech_underrun_streams_{n}']):.0f}; transformers' audio arrives whole at the end")
        for key, metric, unit, better in SPEECH_METRICS:
            rows.append(Row(f"Qwen3-Omni wide text + speech, {n} concurrent", metric, unit, better,
                            Side(la, a[f"speech_{key}_{n}"]), Side(lb, b[f"speech_{key}_{n}"]),
                            names=("mstar", "transformers"), plot=f"speech-{key}", x=n,
                            xlabel="concurrent requests", note=note))
        for node in SPEECH_NODES:      # mstar's served profile: where the burst's worker time went
            rows.append(Row(f"Qwen3-Omni wide text + speech, {n} concurrent: mstar's worker time per node",
                            f"{node} batches", "s", LOWER, Side(la, a[f"speech_node_s_{node}_{n}"]),
                            names=("mstar", ""), note="the sum of the node's batch run times over the burst "
                                                       "(/metrics mstar_batch_run_ms)"))
    return rows


@register("omni-wide", "Qwen3-Omni-30B-A3B at full width (4 + 4 layers): mstar-run vs transformers' generate, "
                       "text and text + speech, 1 and 8 concurrent")
def run(ctx: Context) -> list[Row]:
    plan = compile_plan(ctx.root / "graphs/qwen3_omni.yaml", ctx.root / "bench-results/plans/omni-wide.plan.bin",
                        "--preset", "omni-wide")
    files = ensure(ctx, plan, prompt_words())
    sides = {"mstar": Mstar(ctx, plan, files), "transformers": Transformers(ctx, plan, files)}
    ctx.settings.update(text_tokens=sides["mstar"].tokens, speech_tokens=SPEECH_TOKENS, frames=sides["mstar"].frames,
                        concurrency=list(QUICK_CONCURRENCY if ctx.quick else CONCURRENCY), voice=VOICE,
                        weights=str(files.repo), kv_budget_bytes=kv_bytes(plan))
    samples = ctx.alternate("omni-wide", sides, warmup=0)
    ctx.settings["sides"] = {name: side.record for name, side in sides.items()}
    return _rows(ctx, samples, sides)
