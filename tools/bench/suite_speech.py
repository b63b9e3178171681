"""speech: how many concurrent speech streams one `mstar-run` holds in real time.

Each tiny model (graphs/qwen3_omni.yaml and graphs/orpheus.yaml, preset `tiny`, placement
`single`, random weights) is served by a real `mstar-run`; N = 8 / 16 / 32 requests are
POSTed at once to `/v1/audio/speech` (SSE, pcm) and every stream gets a simulated
real-time listener (bench/playback.py): playback starts at its first chunk, and a chunk
that arrives after everything before it has played is an underrun. Per N: how many
streams had an underrun, the total underrun seconds over all streams and the median time
to first audio (TTFA). The summary row, "streams held in real time", is the largest N
with no underrun at it or any smaller N (0: not even the smallest).

This is a plain measurement (no baseline peer, like the sched suite), and a property of
the machine as much as of mstar: the client reads every stream in one asyncio loop on the
same machine, so a busy machine delays arrivals too. The ordering that prevents gaps when
capacity allows is tested against a simulated clock (tests/runtime/conductor/test_playback_model.py).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from bench.openai_load import model_card
from bench.playback import held_in_real_time
from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import Server, mstar_run
from bench.speech_load import SAMPLE_RATE, listener_metrics, speech_burst
from bench.stats import HIGHER, LOWER
from bench.peer_mstar import compile_plan

CONCURRENCY, QUICK_CONCURRENCY = (8, 16, 32), (4, 8)
WORKER_THREADS = 1   # tiny forwards take microseconds: a second OpenMP thread only spin-waits (shared cores)
Bodies = Callable[[str, int], list[dict]]   # (model id, streams) -> request bodies


@dataclass(frozen=True)
class Model:
    """One served speech model of the suite: its graph, its name in rows, its requests."""

    graph: str
    title: str
    plot: str
    bodies: Bodies
    asked: str          # the audio asked per stream, in words


def _omni_bodies(model: str, n: int) -> list[dict]:
    return [{"model": model, "voice": "ethan", "input": f"Line {i}.", "seed": i, "max_audio_frames": 60}
            for i in range(n)]


def _orpheus_bodies(model: str, n: int) -> list[dict]:
    return [{"model": model, "voice": "tara", "input": f"Line {i}.", "seed": i, "max_tokens": 280}
            for i in range(n)]


MODELS = (Model("qwen3_omni", "Qwen3-Omni tiny", "omni", _omni_bodies, "60 codec frames (4.8 s) per stream"),
          Model("orpheus", "Orpheus tiny", "orpheus", _orpheus_bodies, "280 audio tokens (40 frames, 3.4 s) per stream"))


def held_per_round(per_n: dict[int, dict[str, list[float]]]) -> list[float]:
    """"Streams held in real time" of each round, from each N's per-round underrun counts."""
    rounds = {len(samples["underrun_streams"]) for samples in per_n.values()}
    if len(rounds) != 1:
        raise ValueError(f"every concurrency needs the same number of rounds, got {sorted(rounds)}")
    return [float(held_in_real_time({n: int(s["underrun_streams"][r]) for n, s in per_n.items()}))
            for r in range(rounds.pop())]


def _rows(model: Model, label: str, per_n: dict[int, dict[str, list[float]]], note: str) -> list[Row]:
    rows = []
    for n, s in per_n.items():
        case = f"{model.title}, {n} concurrent"
        detail = (f"{note}; audio per stream: least {min(s['audio_s']):.2f} s, median "
                  f"{statistics.median(s['median_audio_s']):.2f} s; least chunks {min(s['chunks']):.0f}")
        rows += [Row(case, "streams with an underrun", "streams", LOWER, Side(label, s["underrun_streams"]),
                     plot=f"{model.plot}-underrun-streams", x=n, xlabel="concurrent streams", note=detail,
                     names=("mstar", "")),
                 Row(case, "total underrun", "s", LOWER, Side(label, s["underrun_s"]),
                     plot=f"{model.plot}-underrun-s", x=n, xlabel="concurrent streams", names=("mstar", "")),
                 Row(case, "median time to first audio", "s", LOWER, Side(label, s["ttfa"]),
                     plot=f"{model.plot}-ttfa", x=n, xlabel="concurrent streams", names=("mstar", ""))]
    measured = "/".join(map(str, per_n))
    rows.append(Row(model.title, "streams held in real time", "streams", HIGHER, Side(label, held_per_round(per_n)),
                    note=f"the largest N of {measured} with no underrun at it or any smaller N; 0: none",
                    names=("mstar", "")))
    return rows


def model_rows(ctx: Context, model: Model) -> list[Row]:
    """Serve `model`'s tiny preset, warm it with one stream, then measure every concurrency."""
    plan = compile_plan(ctx.root / "graphs" / f"{model.graph}.yaml",
                        ctx.root / "bench-results/plans" / f"{model.graph}-tiny-single.plan.bin",
                        "--preset", "tiny", "--placement", "single")
    threads = ctx.threads or WORKER_THREADS
    log = ctx.root / "bench-results/logs" / f"speech-{model.graph}.log"
    with mstar_run(plan, log, f"mstar-run {model.graph} tiny", threads) as srv:
        measure = _measure(srv, model)
        measure(1)
        per_n = {n: ctx.alternate(f"speech {model.graph} {n} streams", {"mstar": lambda n=n: measure(n)},
                                  warmup=0)["mstar"]
                 for n in (QUICK_CONCURRENCY if ctx.quick else CONCURRENCY)}
    label = f"mstar-run {model.graph}.yaml --preset tiny --placement single, N SSE pcm streams at once"
    note = (f"{model.asked}; random weights; torch threads per worker {threads}; client and server share "
            "the machine's cores")
    return _rows(model, label, per_n, note)


def _measure(srv: Server, model: Model) -> Callable[[int], dict[str, float]]:
    name = model_card(srv.url)["id"]
    return lambda n: listener_metrics(speech_burst(srv.url, model.bodies(name, n)), SAMPLE_RATE)


@register("speech", "concurrent speech streams held in real time (Qwen3-Omni / Orpheus tiny, served, "
                    "simulated listener per stream)")
def run(ctx: Context) -> list[Row]:
    ctx.settings.update(concurrency=list(QUICK_CONCURRENCY if ctx.quick else CONCURRENCY),
                        worker_threads=ctx.threads or WORKER_THREADS, sample_rate=SAMPLE_RATE,
                        baseline="none: absolute figures of this machine")
    rows: list[Row] = []
    for model in MODELS[:1] if ctx.quick else MODELS:
        try:
            rows += model_rows(ctx, model)
        except (Needs, RuntimeError) as exc:
            ctx.record_needs(model.title, exc if isinstance(exc, Needs) else Needs(str(exc)))
    return rows
