"""The executors a plan may name: `register_executor(name)` fills the table (each family's
`runtime/models/<family>/executors.py`, plugins through the entry-point group ``mstar.executors``);
`executor_for` builds the one a node names."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Callable

import torch

from mstar_compiler.catalogue import BUILTIN_FAMILIES
from mstar_compiler.plan import Node, Plan
from runtime.worker.executors.base import Executor
from runtime.worker.executors.stateless import stateless_executor

ExecutorFactory = Callable[[Plan, Node, torch.nn.Module, int], Executor]

_EXECUTORS: dict[str, ExecutorFactory] = {"stateless": stateless_executor}


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
    executor = _EXECUTORS[node.executor](plan, node, module, rank)
    if Executor not in type(executor).__mro__:
        raise TypeError(f"executor {node.executor!r} of node '{node.name}' built a {type(executor).__name__}, which does "
                        f"not subclass runtime.worker.executors.Executor (the interface the worker calls, with its defaults)")
    return executor
