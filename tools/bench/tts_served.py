"""The served half of the tts suite: real `mstar-run` processes, streamed `/v1/audio/speech`.

Orpheus, at 1 / 8 / 16 concurrent streams: two servers of the same nodes, weights and runtime,
whose graph copies (tts_graphs.py) differ only in the lm->snac policy, started side by side:
  mstar:    graphs/orpheus.yaml's lm->snac policy (sliding 28 / 7): SNAC decodes each window
            as the buffer releases it and the server sends it at once
  baseline: the lm->snac policy `fixed: K` with K above any request's length: one chunk of all
            tokens after the last, one SNAC decode per request (generate-then-decode). The
            non-streamed response is not that baseline: the runtime still decodes windows as
            they are released and only the client's bytes wait, so it would time the same
            compute with a later first byte.
Every baseline stream must arrive in one chunk and every streamed one in several, or the
comparison is refused. Qwen3-Omni (mid-size copy), at 1 and 4 concurrent requests: the same
speech requests to placement `thinker_talker` (split) and to `single` (co-located).

TTFA is the median over streams of send -> first audio bytes; RTF is the burst's wall time
over the mean seconds of audio a stream received (lower is better for both). Each server is
warmed with one request; then the sides alternate A B A B.
"""
from __future__ import annotations

import contextlib
from typing import Callable

from bench.openai_load import model_card
from bench.registry import Context, Needs
from bench.results import Row, Side
from bench.servers import Server, mstar_run
from bench.speech_load import SAMPLE_RATE, speech_burst
from bench.stats import LOWER
from bench.tts_graphs import node_params, omni_plan, orpheus_plans, orpheus_policy

ORPHEUS_STREAMS, OMNI_CONCURRENCY = (1, 8, 16), (1, 4)
OMNI_FRAMES, QUICK_OMNI_FRAMES, OMNI_TEXT_TOKENS = 100, 50, 16   # codec frames of 80 ms; thinker tokens
METRICS = (("ttfa", "time to first audio", "s"), ("rtf", "real-time factor", "x"))
Bodies = Callable[[str, int], list[dict]]    # (model id, concurrency) -> request bodies


def threads(ctx: Context) -> str:
    """The workers' torch threads, in words for a row's note."""
    return f"torch threads per worker: {ctx.threads or 'the server default (cores / local workers)'}"


def _measure(srv: Server, bodies: Bodies, concurrency: int) -> Callable[[], dict[str, float]]:
    model = model_card(srv.url)["id"]
    return lambda: speech_burst(srv.url, bodies(model, concurrency)).metrics(SAMPLE_RATE)


def _compare(ctx: Context, label: str, servers: dict[str, Server], bodies: Bodies,
             concurrency: int) -> dict[str, dict[str, list[float]]]:
    sides = {name: _measure(srv, bodies, concurrency) for name, srv in servers.items()}
    return ctx.alternate(label, sides, warmup=0)


def _rows(case: str, samples: dict, labels: dict[str, str], x: int, plot: str, xlabel: str, note: str,
          names: tuple[str, str] = ("mstar", "baseline")) -> list[Row]:
    a, b = (samples[n] for n in ("mstar", "baseline"))
    return [Row(case, metric, unit, LOWER, Side(labels["mstar"], a[key]), Side(labels["baseline"], b[key]),
                plot=f"{plot}-{key}", x=x, xlabel=xlabel, note=note, names=names)
            for key, metric, unit in METRICS]


def _start(ctx: Context, stack: contextlib.ExitStack, plans: dict, bodies: Bodies) -> dict[str, Server]:
    """Start one server per side and warm it with one request."""
    servers = {}
    for side, (plan, name) in plans.items():
        log = ctx.root / "bench-results/logs" / f"tts-{plan.stem}.log"
        servers[side] = stack.enter_context(mstar_run(plan, log, name, ctx.threads))
        _measure(servers[side], bodies, 1)()
    return servers


def _orpheus_bodies(num_tokens: int) -> Bodies:
    return lambda model, n: [{"model": model, "voice": "tara", "input": f"Line {i}: hello there.", "seed": i,
                              "max_tokens": num_tokens} for i in range(n)]


def _check_orpheus(samples: dict) -> None:
    if max(samples["baseline"]["max_chunks"]) != 1:
        raise Needs("the fixed-policy baseline to decode once per request; a stream got "
                    f"{max(samples['baseline']['max_chunks']):.0f} chunks")
    if min(samples["mstar"]["chunks"]) < 2:
        raise Needs("the sliding-window side to stream; a request got its audio in one chunk")


def orpheus_rows(ctx: Context, num_tokens: int) -> list[Row]:
    """Orpheus served at 1 / 8 / 16 streams: sliding-window streaming vs generate-then-decode."""
    streamed, gtd, k = orpheus_plans(ctx)
    (name, value), = orpheus_policy(ctx).items()
    policy = f"{name}({', '.join(map(str, value.values())) if isinstance(value, dict) else value})"
    labels = {"mstar": f"mstar-run, streamed: lm->snac {policy}, each window decoded and sent",
              "baseline": f"mstar-run, generate-then-decode: lm->snac fixed({k}), one SNAC decode at the end"}
    rows, bodies = [], _orpheus_bodies(num_tokens)
    with contextlib.ExitStack() as stack:
        servers = _start(ctx, stack, {"mstar": (streamed, "mstar-run orpheus streamed"),
                                      "baseline": (gtd, "mstar-run orpheus generate-then-decode")}, bodies)
        for streams in ORPHEUS_STREAMS:
            samples = _compare(ctx, f"tts served orpheus {streams} streams", servers, bodies, streams)
            _check_orpheus(samples)
            note = (f"{num_tokens} audio tokens asked per stream, {min(samples['mstar']['tokens']):.0f} / "
                    f"{min(samples['baseline']['tokens']):.0f} generated (least, mstar / baseline), "
                    f"{min(samples['mstar']['samples']) / SAMPLE_RATE:.2f} s of audio; LM orpheus-tiny, SNAC "
                    f"24 kHz full size; the sides differ only in the lm->snac policy; {threads(ctx)}")
            rows += _rows(f"Orpheus served (mstar-run), {streams} concurrent", samples, labels, streams,
                          "served", "concurrent streams", note)
    return rows


def _omni_bodies(frames: int) -> Bodies:
    return lambda model, n: [{"model": model, "voice": "ethan", "input": f"Line {i}: say something nice.",
                              "seed": i, "max_tokens": OMNI_TEXT_TOKENS, "max_audio_frames": frames}
                             for i in range(n)]


def omni_rows(ctx: Context) -> list[Row]:
    """Qwen3-Omni mid served at 1 / 4 concurrent: talker + code2wav split from the thinker vs co-located."""
    frames = QUICK_OMNI_FRAMES if ctx.quick else OMNI_FRAMES
    plans = {"mstar": (omni_plan(ctx, "thinker_talker"), "mstar-run qwen3-omni split"),
             "baseline": (omni_plan(ctx, "single"), "mstar-run qwen3-omni co-located")}
    labels = {"mstar": "mstar-run thinker_talker: talker, code_predictor, code2wav on rank 1 (2 workers)",
              "baseline": "mstar-run single: all nodes on rank 0 (1 worker)"}
    params = node_params(plans["mstar"][0])
    sizes = ", ".join(f"{n} {params[n] / 1e6:.1f}M" for n in ("thinker", "talker", "code_predictor", "code2wav"))
    rows, bodies = [], _omni_bodies(frames)
    with contextlib.ExitStack() as stack:
        servers = _start(ctx, stack, plans, bodies)
        for n in OMNI_CONCURRENCY:
            samples = _compare(ctx, f"tts served qwen3-omni {n} concurrent", servers, bodies, n)
            note = (f"text in, speech out: {OMNI_TEXT_TOKENS} text tokens, up to {frames} codec frames per request, "
                    f"least audio {min(samples['mstar']['samples']) / SAMPLE_RATE:.2f} s / "
                    f"{min(samples['baseline']['samples']) / SAMPLE_RATE:.2f} s (split / co-located); "
                    f"bench-results/graphs/qwen3_omni-mid.yaml, parameters {sizes}; {threads(ctx)}")
            rows += _rows(f"Qwen3-Omni mid served: split vs co-located, {n} concurrent", samples, labels, n,
                          "omni", "concurrent requests", note, names=("split", "co-located"))
    return rows
