"""Runs a node without a KV cache: one forward per request, inputs by port name.

The module is called as `module(**{input_port: tensor})`; a tensor result is its single
output port, a tuple fills the output ports in order, a mapping is taken by port name.
Requests run one after another: components of this kind differ in shapes per request
(image sizes, audio lengths), so stacking them is the component's business, not ours.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors.base import CachelessExecutor, ExecResult
from runtime.transport.messages import WorkItem
from runtime.model_executor.parallel.cpu_linear import device_of


class StatelessExecutor(CachelessExecutor):
    """A node whose output depends only on this call's inputs."""

    def __init__(self, node: Node, module: torch.nn.Module) -> None:
        self.node = node
        self.module = module
        self.out_ports = [p.name for p in node.outputs]
        self.device = device_of(module)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        results = []
        for item, ins in zip(items, inputs):
            if item.tokens:
                ins = {**ins, "tokens": torch.tensor(item.tokens, dtype=torch.long)}
            ins = {port: t.to(self.device) for port, t in ins.items()}
            results.append(ExecResult(outputs=self._by_port(self.module(**ins))))
        return results

    def _by_port(self, out: Any) -> dict[str, torch.Tensor]:
        if isinstance(out, torch.Tensor):
            return {self.out_ports[0]: out}
        if isinstance(out, Mapping):
            return {k: v for k, v in out.items() if k in self.out_ports}
        return dict(zip(self.out_ports, out))


def stateless_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> StatelessExecutor:
    return StatelessExecutor(node, module)
