"""tts: speech. Orpheus time to first audio (TTFA) and real-time factor (RTF) at 1 / 8 / 16
concurrent streams, streamed vs generate-then-decode, both in-process and served; Qwen3-Omni
talker + code2wav split from the thinker vs co-located, served.

Served rows (tts_served.py) go through real `mstar-run` processes and `/v1/audio/speech`.
In-process rows (this module) are the component-level view of the same Orpheus comparison,
without server, conductor or transport: the `lm` node of graphs/orpheus.yaml's tiny preset
(random weights, greedy, driven by its `DecoderLMExecutor`, all streams in one batch)
produces N audio tokens per stream; each sampled id is mapped onto a valid audio token of
its frame position so SNAC decodes real codes. The decoder is `snac_decoder` at its full
24 kHz size (19.8M parameters), which is where streaming costs or saves time.
  mstar:    every token goes into the stream's `StreamBuffer(Sliding(28, 7))`; each
            released window of every stream decodes in one `decode_chunks` batch
  baseline: generate all N tokens, then decode each stream once (generate-then-decode)
TTFA is the median over streams of the time to the first audio samples; RTF is the
wall time over the seconds of audio each stream gets (lower is better for both).
"""
from __future__ import annotations

import time
from typing import Callable

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import LOWER
from bench.peer_mstar import compile_plan
from bench.tts_served import (OMNI_CONCURRENCY, OMNI_FRAMES, ORPHEUS_STREAMS, QUICK_OMNI_FRAMES, omni_rows,
                              orpheus_rows)
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

STREAMS = ORPHEUS_STREAMS          # the in-process rows take the served cases
FRAMES, QUICK_FRAMES = 24, 8            # audio per stream: frames of 2048 samples (85 ms)
PROMPT_TOKENS, SAMPLE_RATE = 16, 24000
MSTAR = "in-process, streamed: Sliding(28, 7) windows, batched SNAC decode per release"
BASELINE = "in-process, generate-then-decode: all tokens, then one SNAC decode per stream"


class _Orpheus:
    """The tiny Orpheus LM node and a full-size SNAC 24 kHz decoder, in this process."""

    def __init__(self, ctx: Context) -> None:
        try:
            import torch
            from mstar_compiler.catalogue import load_catalogue
            from mstar_compiler.plan import load_plan
            from runtime.model_executor.components import component_class
            from runtime.conductor.local_run import LocalRun
            from runtime.models.decoder_lm.executors import DecoderLMExecutor
            from runtime.streams import Sliding, StreamBuffer
            from runtime.transport.messages import WorkItem
            from runtime.worker.loader import load_rank
        except ImportError as exc:
            raise Needs(f"Orpheus' components and the decoder LM executor: {exc}") from exc
        plan = load_plan(compile_plan(ctx.root / "graphs/orpheus.yaml", ctx.root / "bench-results/plans/orpheus-tiny.plan.bin",
                                      "--preset", "tiny"))
        node = next(n for n in plan.nodes if n.kind == "llama_lm")
        self.executor = LocalRun(DecoderLMExecutor(node, load_rank(plan, 0, None)[node.name][0], 0))
        spec = load_catalogue()["snac_decoder"]
        torch.manual_seed(0)
        self.snac = component_class("snac_decoder")(spec.presets["24khz"], dict(spec.args)).eval()
        self.torch, self.WorkItem, self.buffer = torch, WorkItem, lambda: StreamBuffer(Sliding(28, 7))

    def audio_token(self, position: int, sampled: int) -> int:
        """A valid Orpheus audio id for stream position `position`, derived from the sampled id."""
        return self.snac.offset + self.snac.codebook_size * (position % 7) + sampled % self.snac.codebook_size

    def generate(self, streams: int, num_tokens: int, on_token) -> None:
        """Greedy decode of `streams` requests in one batch; on_token(position, ids) after every step."""
        for rid in range(streams):
            self.executor.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
        items = [self.WorkItem(rid, tokens=list(range(1, PROMPT_TOKENS + 1))) for rid in range(streams)]
        for position in range(num_tokens):
            results = self.executor.run(items, [{}] * streams)
            on_token(position, [self.audio_token(position, r.tokens[0]) for r in results])
            items = [self.WorkItem(rid, tokens=r.tokens) for rid, r in enumerate(results)]
        for rid in range(streams):
            self.executor.close(rid, kv_only=False)


def _metrics(start: float, first: list[float], samples: list[int]) -> dict[str, float]:
    import statistics
    wall = time.perf_counter() - start
    return {"ttfa": statistics.median(first), "rtf": wall / (statistics.mean(samples) / SAMPLE_RATE),
            "samples": float(min(samples))}


def streamed(orph: _Orpheus, streams: int, num_tokens: int) -> dict[str, float]:
    """Sliding-window streaming: decode every released window of every stream as it comes."""
    start, buffers = time.perf_counter(), [orph.buffer() for _ in range(streams)]
    first, samples = [0.0] * streams, [0] * streams

    def drain() -> None:
        while ready := [(b, c) for b, buf in enumerate(buffers) if (c := buf.take()) is not None]:
            chunks = [c for _, c in ready]
            audio = orph.snac.decode_chunks([orph.torch.tensor(c.items) for c in chunks], [c.start for c in chunks],
                                            [c.num_context for c in chunks], [c.is_final for c in chunks])
            for (b, _), a in zip(ready, audio):
                if a.numel() and not samples[b]:
                    first[b] = time.perf_counter() - start
                samples[b] += a.numel()

    def on_token(position: int, ids: list[int]) -> None:
        for buf, i in zip(buffers, ids):
            buf.push(i)
            if position == num_tokens - 1:
                buf.finish()
        drain()

    orph.generate(streams, num_tokens, on_token)
    return _metrics(start, first, samples)


def generate_then_decode(orph: _Orpheus, streams: int, num_tokens: int) -> dict[str, float]:
    """All tokens first, then one decode of each whole stream (one batch)."""
    start, tokens = time.perf_counter(), [[] for _ in range(streams)]
    orph.generate(streams, num_tokens, lambda p, ids: [t.append(i) for t, i in zip(tokens, ids)])
    audio = orph.snac.decode_chunks([orph.torch.tensor(t) for t in tokens], [0] * streams, [0] * streams,
                                    [True] * streams)
    done = time.perf_counter() - start
    return _metrics(start, [done] * streams, [a.numel() for a in audio])


def _inprocess_rows(ctx: Context, orph: _Orpheus, streams: int, num_tokens: int) -> list[Row]:
    samples = ctx.alternate(f"tts in-process orpheus {streams} streams", {
        "mstar": lambda: streamed(orph, streams, num_tokens),
        "baseline": lambda: generate_then_decode(orph, streams, num_tokens)}, warmup=0)
    audio_s = samples["mstar"]["samples"][0] / SAMPLE_RATE
    note = (f"{num_tokens} audio tokens = {audio_s:.2f} s of audio per stream (generate-then-decode: "
            f"{samples['baseline']['samples'][0] / SAMPLE_RATE:.2f} s); LM orpheus-tiny, SNAC 24 kHz full size")
    return [Row(f"Orpheus in-process (components), {streams} concurrent", metric, "s" if key == "ttfa" else "x", LOWER,
                Side(MSTAR, samples["mstar"][key]), Side(BASELINE, samples["baseline"][key]),
                plot=f"in-process-{key}", x=streams, xlabel="concurrent streams", note=note)
            for key, metric in (("ttfa", "time to first audio"), ("rtf", "real-time factor"))]


def _served(ctx: Context, case: str, rows: Callable[[], list[Row]]) -> list[Row]:
    """A served comparison's rows; a server that cannot start or answer becomes a `needs` entry."""
    try:
        return rows()
    except (Needs, RuntimeError) as exc:
        ctx.record_needs(case, exc if isinstance(exc, Needs) else Needs(str(exc)))
        return []


@register("tts", "Orpheus TTFA/RTF at 1/8/16 streams, streamed vs generate-then-decode (served and in-process); "
                 "Qwen3-Omni talker+code2wav split vs co-located (served)")
def run(ctx: Context) -> list[Row]:
    num_tokens = 7 * (QUICK_FRAMES if ctx.quick else FRAMES)
    ctx.settings.update(streams=list(STREAMS), window=28, stride=7, audio_tokens=num_tokens,
                        worker_threads=ctx.threads, omni_concurrency=list(OMNI_CONCURRENCY),
                        omni_frames=QUICK_OMNI_FRAMES if ctx.quick else OMNI_FRAMES)
    rows = _served(ctx, "Orpheus served", lambda: orpheus_rows(ctx, num_tokens))
    rows += _served(ctx, "Qwen3-Omni served, split vs co-located", lambda: omni_rows(ctx))
    orph = _Orpheus(ctx)
    for side in (streamed, generate_then_decode):   # warm-up, one stream
        side(orph, 1, num_tokens)
    return rows + [row for streams in STREAMS for row in _inprocess_rows(ctx, orph, streams, num_tokens)]
