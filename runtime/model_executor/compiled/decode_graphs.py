"""`DecodeGraphs`: a decoder LM's decode step, padded to batch buckets and CUDA-graph captured per bucket.

Who calls it: `DecoderLMExecutor` (runtime/models/decoder_lm/executors.py) for decode-only
batches of a node that the plan's capture pass put in a capture region, on CUDA. Per
bucket there is one attention backend instance (planned once; see
runtime/model_executor/attention/triton_backend.py for why that keeps a graph valid), one graph and
its output buffers. A step:

    batch = inputs.fill(bucket, tokens, tables, seq_lens)   # host -> static buffers, padded
    backend.plan(batch, shape)                              # in place: no new device tensors
    graph.replay()                                          # forward_planned + compute_logits

With `use_graphs=False` (every CPU run) the same padded step runs eagerly: that is what
the CPU tests check against the unpadded step. With `compiled=True` (CPU) each bucket's
step is compiled by inductor instead (cpu_compile.py): the same regions and buckets, the
other backend. Graphs are captured (steps compiled) lazily on a bucket's first use, or all
at once with `capture_all()` (largest first, so the smaller ones reuse its memory pool).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from runtime.model_executor.attention import AttentionBackend, AttentionMetadata, select_backend
from runtime.model_executor.attention.paged_decode import PagedDecodeAttention
from runtime.model_executor.compiled.buckets import bucket_for
from runtime.model_executor.compiled.cpu_compile import compile_step
from runtime.model_executor.compiled.decode_inputs import DecodeInputs
from runtime.model_executor.kv import PagedKVCache
from runtime.model_executor.layers import DecoderLM
from runtime import progress

log = logging.getLogger(__name__)
WARMUP_RUNS = 2   # eager runs before a capture: Triton compiles, the caching allocator settles


@dataclass
class _BucketStep:
    backend: AttentionBackend
    graph: torch.cuda.CUDAGraph | None     # None: run eagerly
    hidden: torch.Tensor | None = None     # (bucket, hidden) output buffer of the graph
    logits: torch.Tensor | None = None     # (bucket, vocab) fp32 output buffer of the graph
    compiled: Callable | None = None       # the inductor-compiled `_forward` (CPU compile), else None


class DecodeGraphs:
    """Decode steps of `model` over `cache` for batches of up to max(buckets) requests."""

    def __init__(self, model: DecoderLM, cache: PagedKVCache, buckets: Sequence[int], max_blocks: int,
                 use_graphs: bool | None = None, compiled: bool = False) -> None:
        if not buckets:
            raise ValueError("DecodeGraphs needs at least one batch bucket")
        self.model, self.cache = model, cache
        self.device = cache.k[0].device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and compiled:
            raise ValueError("a decode step is either CUDA-graph captured or compiled for the CPU, not both")
        self.compiled = compiled
        if (self.use_graphs or compiled) and not model.is_graph_capturable:
            raise ValueError(f"{type(model).__name__} cannot be CUDA-graph captured or compiled as one step (MoE or tensor parallel)")
        self.buckets = tuple(sorted(set(buckets)))
        self.inputs = DecodeInputs(cache, self.buckets[-1], max_blocks)
        self.shape = model.attention_shape(cache.dtype)
        self._steps: dict[int, _BucketStep] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    @property
    def prepared_buckets(self) -> tuple[int, ...]:
        """Buckets whose step is ready (captured, on CUDA), in increasing order."""
        return tuple(sorted(self._steps))

    def can_run(self, block_tables: Sequence[Sequence[int]], seq_lens: Sequence[int]) -> bool:
        """Whether a decode batch with these tables and lengths fits a bucket and the buffers."""
        return bucket_for(len(seq_lens), self.buckets) is not None and self.inputs.fits(block_tables, seq_lens)

    def run(self, tokens: Sequence[int], block_tables: Sequence[Sequence[int]],
            seq_lens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step: each request's new token, its block table and its length after
        the step (the token included). Returns fp32 logits (n, vocab) and final-normed hidden
        states (n, hidden) of the n requests: views of static buffers, valid until the next run."""
        n = len(tokens)
        bucket = bucket_for(n, self.buckets)
        if bucket is None:
            raise ValueError(f"a decode batch of {n} requests fits no bucket of {self.buckets}; check can_run first")
        step = self._steps.get(bucket) or self._prepare(bucket)
        # in inference mode whoever calls: a compiled step guards on its inputs' dispatch keys, so
        # the tensors `plan` builds must be inference tensors here as they were at the compile
        with torch.inference_mode():
            batch = self.inputs.fill(bucket, tokens, block_tables, seq_lens)
            step.backend.plan(batch, self.shape)
            if step.compiled is not None:
                hidden, logits = step.compiled(bucket, step.backend, batch)
            elif step.graph is None:
                hidden, logits = self._step(bucket, step.backend, batch)
            else:
                step.graph.replay()
                hidden, logits = step.hidden, step.logits
        return logits[:n], hidden[:n]

    def capture_all(self) -> None:
        """Prepare every bucket now, largest first (start-up, not in a request's latency)."""
        for bucket in reversed(self.buckets):
            if bucket not in self._steps:
                self._prepare(bucket)

    def _prepare(self, bucket: int) -> _BucketStep:
        """The bucket's backend, and its graph when capturing: captured on a batch of
        padding rows only, so capture writes no request's cache."""
        backend = self._backend()
        if self.compiled:
            step = self._compile(bucket, backend)
        elif not self.use_graphs:
            step = _BucketStep(backend, None)
        else:
            batch = self.inputs.fill(bucket, (), (), ())
            backend.plan(batch, self.shape)
            step = self._capture(bucket, backend, batch)
            log.info("captured a CUDA graph for decode batches of %d", bucket)
        self._steps[bucket] = step
        done = "compiled" if self.compiled else "captured" if self.use_graphs else "prepared"
        progress.advance(f"{done} the decode step for batches of {bucket}")
        return step

    def _backend(self) -> AttentionBackend:
        if self.compiled:
            return PagedDecodeAttention()
        backend = select_backend(self.device, self.model.backend_name)
        if self.use_graphs and not backend.is_graph_safe:
            log.info("attention backend %s cannot run in a CUDA graph; captured steps use triton", backend.name)
            backend = select_backend(self.device, "triton")
        return backend

    @torch.inference_mode()
    def _forward(self, bucket: int, backend: AttentionBackend,
                 batch: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        return self._step(bucket, backend, batch)

    def _step(self, bucket: int, backend: AttentionBackend,
              batch: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        # what inductor compiles: an inference_mode inside the traced code would break it
        hidden = self.model.forward_planned(self.inputs.input_ids(bucket), self.inputs.positions(bucket), batch,
                                            self.cache, backend)                        # (bucket, hidden)
        return hidden, self.model.compute_logits(hidden)                                # (bucket, vocab)

    def _compile(self, bucket: int, backend: AttentionBackend) -> _BucketStep:
        """The bucket's step compiled, and compiled now: run once on padding rows only (they write
        only the padding slot), so no request waits for inductor."""
        step = compile_step(self._step, len(self.buckets))
        start = time.perf_counter()
        with torch.inference_mode():     # as every later step runs (`run`)
            batch = self.inputs.fill(bucket, (), (), ())
            backend.plan(batch, self.shape)
            # one eager run first, as before a CUDA capture: what the model builds lazily on first use
            # (the rotary's per-device frequencies) then exists when it is traced, and is not a
            # guard that fails on the first real step (a recompile in a request's latency)
            self._step(bucket, backend, batch)
            step(bucket, backend, batch)
        log.warning("compiled the CPU decode step for batches of %d in %.1f s (inductor C++)", bucket,
                    time.perf_counter() - start)
        return _BucketStep(backend, None, compiled=step)

    def _capture(self, bucket: int, backend: AttentionBackend, batch: AttentionMetadata) -> _BucketStep:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self._forward(bucket, backend, batch)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            hidden, logits = self._forward(bucket, backend, batch)
        return _BucketStep(backend, graph, hidden, logits)
