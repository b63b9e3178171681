"""Per-kind adapters that turn one batch of requests into component calls (worker side).

An executor owns one node on one rank: its module (weights possibly shared with `same_as`
nodes), its KV cache, and per-request state (sampling). The worker calls:

    ex.open(request_id, params)          a request's params, once, before its first batch
    ex.run(items, inputs) -> results     one batch: `inputs[i]` maps input port -> tensor
    ex.close(request_id, kv_only)        free the request's KV blocks (and state unless kv_only)
    ex.kv_blocks, ex.kv_block_size       pool size (0 when the node keeps no KV cache)

`executor_for(node, module, rank, plan)` picks the adapter for the node's kind. An executor
may carry a `group` attribute: queued batches of executors with the same group run as
one call, `group.run_group([(executor, items, inputs), ...])` (BAGEL's CFG branches).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mstar_compiler.plan import Node, Plan
from runtime.transport.messages import WorkItem


@dataclass
class ExecResult:
    """One request's outcome of a batch."""

    tokens: list[int] = field(default_factory=list)            # sampled token ids
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # output port -> tensor
    finished: str = ""                                         # the node ends the request's loop ("eos")


class Executor(Protocol):
    kv_blocks: int
    kv_block_size: int

    def open(self, request_id: int, params: dict[str, Any]) -> None: ...
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]: ...
    def close(self, request_id: int, kv_only: bool) -> None: ...
    def kv_used_blocks(self) -> int: ...


class CachelessExecutor:
    """Base of executors whose node keeps no KV cache and no per-request state."""

    kv_blocks = 0
    kv_block_size = 0

    def open(self, request_id: int, params: dict[str, Any]) -> None:
        return None

    def close(self, request_id: int, kv_only: bool) -> None:
        return None

    def kv_used_blocks(self) -> int:
        return 0


def executor_for(node: Node, module: torch.nn.Module, rank: int, plan: Plan | None = None) -> Executor:
    """The adapter that runs `node` (its kind decides which; BAGEL's kinds need the plan)."""
    from runtime.executors.bagel import bagel_executor
    from runtime.executors.decoder_lm import DecoderLMExecutor
    from runtime.executors.specialised import specialised_executor
    from runtime.executors.stateless import StatelessExecutor
    special = (bagel_executor(plan, node, module, rank) or specialised_executor(plan, node, module, rank)
               if plan is not None else None)   # speech, rollouts: runtime/executors/specialised.py
    if special is not None:
        return special
    if node.has_kv_cache and hasattr(module, "make_kv_cache"):
        return DecoderLMExecutor(node, module, rank, plan)
    return StatelessExecutor(node, module)
