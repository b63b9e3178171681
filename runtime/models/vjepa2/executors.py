"""V-JEPA 2-AC rollouts on the worker: batched encoder, and the predictor's DynamicLoop steps.

The `rollout` walk runs `encoder` once, then a DynamicLoop of `predictor` until the
request's horizon. `RolloutExecutor` keeps one `Rollout` (runtime/models/vjepa2/rollout.py) per
request — its per-frame KV cache, sized for context + horizon at the first step — and
advances every request of a batch by one predicted frame per Run with `rollout_step`:
requests at different steps, with different contexts and horizons, share one call.
A finished rollout's cache is dropped at once; `close` drops an unfinished one.
"""
from __future__ import annotations

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors import CachelessExecutor, ExecResult, Executor
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.models.vjepa2 import Rollout, rollout_step, start_rollout
from runtime.model_executor.parallel.cpu_linear import device_of


class EncoderExecutor(CachelessExecutor):
    """The `vjepa2_encoder` node: clips (F, 3, H, W) of equal shape run as one batch."""

    def __init__(self, node: Node, module: nn.Module) -> None:
        self.module = module
        self.device = device_of(module)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, ins in enumerate(inputs):
            groups.setdefault(tuple(ins["video"].shape), []).append(i)
        out: list[ExecResult] = [ExecResult() for _ in items]
        for members in groups.values():
            hidden = self.module(torch.stack([inputs[i]["video"] for i in members]).to(self.device))   # (B, T, D)
            for row, i in enumerate(members):
                out[i] = ExecResult(outputs={"hidden": hidden[row]})
        return out


class RolloutExecutor(Executor):
    """The `vjepa2_ac_predictor` node: one predicted frame per request per Run."""

    def __init__(self, node: Node, predictor: nn.Module, rank: int) -> None:
        pool = next(p for p in node.kv_pools if p.rank == rank)
        self.kv_blocks, self.kv_block_size = pool.num_blocks, pool.block_tokens
        self.predictor = predictor
        self.default_horizon = 1
        self._horizons: dict[int, int] = {}
        self._rollouts: dict[int, Rollout] = {}

    def open(self, request_id: int, params: RequestParams) -> None:
        if "horizon" in params.declared:
            self._horizons[request_id] = params.count("horizon")

    def close(self, request_id: int, kv_only: bool) -> None:
        self._rollouts.pop(request_id, None)
        if not kv_only:
            self._horizons.pop(request_id, None)

    def kv_used_blocks(self) -> int:
        """KV blocks' worth of the live rollouts' frame caches (reserved for their whole horizon)."""
        tokens = sum(r.cache.max_steps * r.cache.tokens_per_step for r in list(self._rollouts.values()))
        return -(-tokens // self.kv_block_size)

    def _start(self, request_id: int, ins: dict[str, torch.Tensor]) -> Rollout:
        horizon = self._horizons.get(request_id, self.default_horizon)
        weight = self.predictor.predictor_proj.weight
        frames, states, actions = (ins[k].to(device_of(self.predictor), weight.dtype) for k in ("frames", "states", "actions"))
        return start_rollout(self.predictor, frames, states, actions, horizon)   # frames (C*P, E)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        for item, ins in zip(items, inputs):
            if item.request_id not in self._rollouts:
                self._rollouts[item.request_id] = self._start(item.request_id, ins)
        rollouts = [self._rollouts[item.request_id] for item in items]
        frames = rollout_step(self.predictor, rollouts)                    # per request (P, E)
        for item, rollout in zip(items, rollouts):
            if rollout.is_done:
                del self._rollouts[item.request_id]
        return [ExecResult(outputs={"prediction": f.float()}) for f in frames]


def encoder_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> EncoderExecutor:
    return EncoderExecutor(node, module)


def rollout_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> RolloutExecutor:
    return RolloutExecutor(node, module, rank)
