"""Per-kind adapters that turn one batch of requests into component calls (worker side).

An executor owns one node on one rank: its module (weights possibly shared with `same_as`
nodes), its KV cache, and per-request state (sampling). The worker calls:

    ex.open(request_id, params)          a request's `RequestParams`, once, before its first batch
    ex.run(items, inputs) -> results     one batch: `inputs[i]` maps input port -> tensor
    ex.close(request_id, kv_only)        free the request's KV blocks (and state unless kv_only)
    ex.kv_blocks, ex.kv_block_size       pool size (0 when the node keeps no KV cache)

`executor_for(node, module, rank, plan)` builds the executor the plan names for the node
(`Node.executor`: the graph's `executor:` or the kind's catalogue default), from a registry
filled by `@register_executor(name)` in each family's `runtime/models/<family>/executors.py`
and by plugins through the entry-point group ``mstar.executors``. An executor
may carry a `group` attribute: queued batches of executors with the same group run as
one call, `group.run_group([(executor, items, inputs), ...])` (BAGEL's CFG branches).
"""
from __future__ import annotations

from dataclasses import dataclass, field
import importlib
from importlib.metadata import entry_points
from typing import Callable, Protocol

import torch

from mstar_compiler.catalogue import BUILTIN_FAMILIES
from mstar_compiler.plan import Node, Plan
from runtime.sampling import SamplerOutput, SamplingState
from runtime.transport.messages import TokenLogprob, WorkItem
from runtime.transport.request_params import RequestParams


@dataclass
class ExecResult:
    """One request's outcome of a batch."""

    tokens: list[int] = field(default_factory=list)            # sampled token ids
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # output port -> tensor
    finished: str = ""                                         # the node ends the request's loop ("eos")
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, when the request asked


def token_logprobs(sampled: SamplerOutput, row: int, state: SamplingState) -> list[TokenLogprob]:
    """An ExecResult's `logprobs` for the token sampled at `row`: [] unless its request asked."""
    found = sampled.row_logprobs(row, state.params.logprobs)
    return [] if found is None else [TokenLogprob(*found)]


class Executor(Protocol):
    kv_blocks: int
    kv_block_size: int

    def open(self, request_id: int, params: RequestParams) -> None: ...
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]: ...
    def close(self, request_id: int, kv_only: bool) -> None: ...
    def kv_used_blocks(self) -> int: ...


class CachelessExecutor:
    """Base of executors whose node keeps no KV cache and no per-request state."""

    kv_blocks = 0
    kv_block_size = 0

    def open(self, request_id: int, params: RequestParams) -> None:
        return None

    def close(self, request_id: int, kv_only: bool) -> None:
        return None

    def kv_used_blocks(self) -> int:
        return 0


ExecutorFactory = Callable[[Plan, Node, torch.nn.Module, int], Executor]

_EXECUTORS: dict[str, ExecutorFactory] = {}


def register_executor(name: str) -> Callable[[ExecutorFactory], ExecutorFactory]:
    """Decorator: `factory(plan, node, module, rank)` builds the executor registered as `name`."""

    def deco(factory: ExecutorFactory) -> ExecutorFactory:
        if name in _EXECUTORS and _EXECUTORS[name] is not factory:
            raise ValueError(f"executor {name!r} is registered twice")
        _EXECUTORS[name] = factory
        return factory

    return deco


def _load_executors() -> None:
    """Import every built-in family's executors module and the plugins' (entry points)."""
    import runtime.executors.stateless  # noqa: F401  (registers "stateless")
    for family in BUILTIN_FAMILIES:
        importlib.import_module(f"runtime.models.{family}.executors")
    for ep in entry_points(group="mstar.executors"):
        register_executor(ep.name)(ep.load())


def executor_for(node: Node, module: torch.nn.Module, rank: int, plan: Plan) -> Executor:
    """The executor the plan names for `node` (`Node.executor`: the graph's or the kind's default)."""
    if node.executor not in _EXECUTORS:
        _load_executors()
    if node.executor not in _EXECUTORS:
        raise KeyError(f"node '{node.name}' ({node.source}) names executor {node.executor!r}, which no built-in "
                       f"family or installed plugin registers; known: {', '.join(sorted(_EXECUTORS))}")
    return _EXECUTORS[node.executor](plan, node, module, rank)
