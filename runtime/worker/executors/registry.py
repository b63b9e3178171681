"""The executors a plan may name: the generic `stateless` one and those the model families declare
(`Family.executors` in mstar_compiler/catalogue, each a "module:factory" reference); `executor_for`
builds the one a node names, importing its factory's module on first use."""
from __future__ import annotations

from functools import cache
from typing import Callable

import torch

from mstar_compiler.catalogue import FAMILIES_GROUP, load_families, load_ref
from mstar_compiler.plan import Node, Plan
from runtime.worker.executors.base import Executor
from runtime.worker.executors.stateless import stateless_executor

ExecutorFactory = Callable[[Plan, Node, torch.nn.Module, int], Executor]

_GENERIC: dict[str, ExecutorFactory] = {"stateless": stateless_executor}   # no family's: kinds without a KV cache


@cache
def _declared() -> dict[str, str]:
    """Every executor name a family declares -> its factory's "module:factory" reference."""
    refs: dict[str, str] = {}
    owners = dict.fromkeys(_GENERIC, "the generic runtime")
    for family in load_families().values():
        for name, ref in family.executors.items():
            if name in owners:
                raise ValueError(f"executor {name!r} is declared twice: by {owners[name]} and by family {family.name!r}")
            owners[name], refs[name] = f"family {family.name!r}", ref
    return refs


def executor_for(node: Node, module: torch.nn.Module, rank: int, plan: Plan) -> Executor:
    """The executor the plan names for `node` (`Node.executor`: the graph's or the kind's default)."""
    refs = _declared()
    if node.executor in _GENERIC:
        factory = _GENERIC[node.executor]
    elif node.executor in refs:
        factory = load_ref(refs[node.executor])
    else:
        raise KeyError(f"node '{node.name}' ({node.source}) names executor {node.executor!r}, which no built-in "
                       f"family or installed plugin (entry-point group {FAMILIES_GROUP}) declares; known: "
                       f"{', '.join(sorted([*_GENERIC, *refs]))}")
    executor = factory(plan, node, module, rank)
    if Executor not in type(executor).__mro__:
        raise TypeError(f"executor {node.executor!r} of node '{node.name}' built a {type(executor).__name__}, which does "
                        f"not subclass runtime.worker.executors.Executor (the interface the worker calls, with its defaults)")
    return executor
