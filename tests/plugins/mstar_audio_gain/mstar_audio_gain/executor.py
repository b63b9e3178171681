"""Runtime side of `audio_gain`: its own executor, with per-request state.

A gain applied chunk by chunk would click at the start of an utterance, so this executor
fades each request's audio in over its first `fade_samples` samples. Where a chunk falls in
that ramp depends on how many samples the request has already had: per-request state the
executor keeps from `open` to `close`, across the many Runs of one request's stream. When
the graph binds `initial_gain` to a request param, the request's value scales its audio on
top of the module's learned gain (also kept per request).
"""
from __future__ import annotations

import torch

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors import CachelessExecutor, ExecResult
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams


class FadeInGainExecutor(CachelessExecutor):
    """`audio_gain` nodes: gain * audio * ramp(samples so far), clamped, per request."""

    def __init__(self, node: Node, module: torch.nn.Module) -> None:
        self.module = module
        self.fade_samples = int(node.args.get("fade_samples", 0))
        self.gain_param = node.param_args.get("initial_gain")   # the request param bound to the gain, if any
        self.samples_seen: dict[int, int] = {}      # request id -> samples of audio already faded
        self.gains: dict[int, float] = {}           # request id -> its gain

    def open(self, request_id: int, params: RequestParams) -> None:
        self.samples_seen[request_id] = 0
        self.gains[request_id] = params.number(self.gain_param) if self.gain_param else 1.0

    def close(self, request_id: int, kv_only: bool) -> None:
        if not kv_only:
            self.samples_seen.pop(request_id, None)
            self.gains.pop(request_id, None)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        results = []
        for item, ins in zip(items, inputs):
            audio = ins["audio"].reshape(-1).float()
            start = self.samples_seen[item.request_id]
            position = torch.arange(start, start + audio.numel(), dtype=torch.float32)
            ramp = (position / self.fade_samples).clamp(max=1.0) if self.fade_samples else torch.ones_like(position)
            self.samples_seen[item.request_id] = start + audio.numel()
            results.append(ExecResult(outputs={"audio": self.module(audio * ramp * self.gains[item.request_id])}))
        return results


def fade_in_gain_executor(plan: Plan, node: Node, module: torch.nn.Module, rank: int) -> FadeInGainExecutor:
    """The executor `audio_gain` (named in the family's declaration, catalogue.py)."""
    return FadeInGainExecutor(node, module)
