"""Per-kind adapters that turn one batch of requests into component calls (worker side).

An executor owns one node on one rank: its module (weights possibly shared with `same_as`
nodes), its KV cache, and per-request state (sampling). The worker calls:

    ex.open(request_id, params)          a request's `RequestParams`, once, before its first batch
    ex.run(items, inputs) -> results     one batch: `inputs[i]` maps input port -> tensor
    ex.close(request_id, kv_only)        free the request's KV blocks (and state unless kv_only)
    ex.kv_blocks, ex.kv_block_size       pool size (0 when the node keeps no KV cache)

Everything else the worker may ask (prefix keys, chunked prefill, compiled buckets, a `group` whose
queued batches run as one call, BAGEL's CFG branches) is declared on `Executor` (base.py) with a default.
`executor_for(node, module, rank, plan)` builds the executor the plan names for the node
(`Node.executor`: the graph's `executor:` or the kind's catalogue default): the generic `stateless`
one, or a factory a model family declares in its `Family` (built-ins' in `runtime/models/<family>/executors.py`,
plugins' through the entry-point group ``mstar.families``; registry.py).
"""
from __future__ import annotations

from runtime.worker.executors.base import CachelessExecutor, ExecResult, Executor, RunGroup, token_logprobs
from runtime.worker.executors.registry import ExecutorFactory, executor_for

__all__ = ["CachelessExecutor", "ExecResult", "Executor", "ExecutorFactory", "RunGroup", "executor_for",
           "token_logprobs"]
