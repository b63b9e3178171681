"""π0.5 on the worker: the prefix over a batch of requests, and the action expert as one flow step of a batch of
requests, each at its own step of its own step count.

The expert node runs inside the graph's `repeat: $steps` loop; its prefix input is the prefix node's output,
which the conductor keeps on this rank and hands every iteration, so the prefix is computed once and read by
every step. A request's first step has no carried chunk and starts from its seeded noise: (chunk,
max_action_dim) standard normal drawn from a CPU generator seeded with the request's seed. Step i of N
runs the expert at time 1 - i / N and moves the chunk by -1/N of its velocity, as transformers' `sample_actions`.
"""
from __future__ import annotations

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.executors import CachelessExecutor, ExecResult


class PrefixExecutor(CachelessExecutor):
    """The `pi05_prefix` node: every request's cameras and prompt in one call."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        rows = self.module([torch.tensor(item.tokens, dtype=torch.long) for item in items],
                           [ins["cameras"] for ins in inputs])
        return [ExecResult(outputs={"prefix": r}) for r in rows]


class ExpertExecutor(CachelessExecutor):
    """The `pi05_expert` node: one flow step of each request of a batch (module docstring)."""

    def __init__(self, node: Node, module: nn.Module) -> None:
        self.module = module
        self.device = device_of(module)
        self.shape = (int(node.dims["chunk_size"]), int(node.dims["max_action_dim"]))
        self.steps: dict[int, tuple[int, int]] = {}      # request -> (its step count, its seed)

    def open(self, request_id: int, params: RequestParams) -> None:
        seed = params.sampling.seed
        self.steps[request_id] = (params.count("steps"), 0 if seed is None else seed)

    def close(self, request_id: int, kv_only: bool) -> None:
        if not kv_only:
            self.steps.pop(request_id, None)

    def _noise(self, seed: int) -> torch.Tensor:
        return torch.randn(self.shape, generator=torch.Generator().manual_seed(seed))

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        chunks, times, dts = [], [], []
        for item, ins in zip(items, inputs):
            steps, seed = self.steps[item.request_id]
            carried = ins.get("actions")
            chunks.append((self._noise(seed) if carried is None or carried.numel() == 0 else carried).float())
            dt = -1.0 / steps
            times.append(1.0 + item.step * dt)
            dts.append(dt)
        velocity = self.module([ins["prefix"] for ins in inputs], chunks, torch.tensor(times, dtype=torch.float32))
        return [ExecResult(outputs={"actions": x.to(self.device) + dt * v.float()})
                for x, dt, v in zip(chunks, dts, velocity)]


def prefix_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> PrefixExecutor:
    return PrefixExecutor(module)


def expert_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> ExpertExecutor:
    return ExpertExecutor(node, module)
