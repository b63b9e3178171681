"""The `silero_vad` kind: Silero VAD v6 at 16 kHz, and its executor.

One step reads a window of 512 new samples with the 64 before it in front (zeros before the first):
    x (B, 576) -> right reflect pad 64 -> STFT as a conv (258 filters of 256, hop 128: real and imaginary
    parts of 129 bins) -> magnitude (B, 129, 4) -> conv 129->128 (k3) -> conv 128->64 (k3, stride 2)
    -> conv 64->64 (k3, stride 2) -> conv 64->128 (k3), each + ReLU -> (B, 128)
    -> LSTM cell (state h, c of the previous window) -> ReLU -> 1x1 conv -> sigmoid: P(speech) (B,)
The tensors are the package's `silero_vad_16k.safetensors` as published (names and shapes);
tests/runtime/silero_vad/ checks the probabilities against the package's own TorchScript model.

The executor (`VadExecutor`) runs one step per window: a chunk of the node's `pcm` stream holds
windows of 512 samples (one per item, cut by the realtime session: runtime/entrypoints/http/turns.py),
and the requests of a batch step together, each with its own state, so a batch equals its members alone.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.model_executor.weights import iter_safetensors, load_into, random_tensors
from runtime.model_executor.weights.package_files import PACKAGE_SCHEME, package_file
from runtime.model_executor.weights.slots import parameter_slots
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.executors import ExecResult, Executor


class SileroVad(nn.Module):
    kind = "silero_vad"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any]) -> None:
        super().__init__()
        n_fft, hidden = int(dims["n_fft"]), int(dims["hidden_size"])
        self.window, self.context, self.bins = int(dims["window"]), int(dims["context"]), n_fft // 2 + 1
        self.pad = self.context               # the right reflect padding equals the context
        self.stft_conv = nn.Conv1d(1, 2 * self.bins, n_fft, stride=int(dims["hop"]), bias=False)
        self.conv1 = nn.Conv1d(self.bins, 128, 3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, hidden, 3, padding=1)
        self.lstm_cell = nn.LSTMCell(hidden, hidden)
        self.final_conv = nn.Conv1d(hidden, 1, 1)
        slots = parameter_slots(self)
        ref = args.get("weights")
        if ref:
            path = package_file(ref) if str(ref).startswith(PACKAGE_SCHEME) else ref
            load_into(slots, iter_safetensors(path))
        else:
            load_into(slots, random_tensors(slots, int(args.get("seed", 0))))

    def step(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
             ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x (B, context + window) -> (P(speech) (B,), the LSTM's new (h, c), each (B, hidden))."""
        x = F.pad(x, (0, self.pad), mode="reflect").unsqueeze(1)
        spec = self.stft_conv(x)
        x = (spec[:, :self.bins] ** 2 + spec[:, self.bins:] ** 2).sqrt()
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = torch.relu(conv(x))
        h, c = self.lstm_cell(x.squeeze(-1), state)
        prob = torch.sigmoid(self.final_conv(torch.relu(h).unsqueeze(-1)))       # (B, 1, 1)
        return prob.squeeze(1).mean(dim=1), (h, c)


class VadExecutor(Executor):
    """Each request's windows in order, its state (last `context` samples, h, c) kept between Runs."""

    def __init__(self, module: SileroVad) -> None:
        self.module = module
        self._state: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def open(self, request_id: int, params: RequestParams) -> None:
        h = torch.zeros(self.module.lstm_cell.hidden_size)
        self._state[request_id] = (torch.zeros(self.module.context), h, h.clone())

    def close(self, request_id: int, kv_only: bool) -> None:
        if not kv_only:
            self._state.pop(request_id, None)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, Any]]) -> list[ExecResult]:
        windows = [[it["value"].float() for c in ins.get("pcm", []) for it in c.new_items] for ins in inputs]
        probs: list[list[torch.Tensor]] = [[] for _ in items]
        rids = [item.request_id for item in items]
        for t in range(max((len(w) for w in windows), default=0)):
            rows = [i for i, w in enumerate(windows) if t < len(w)]
            ctx, h, c = (torch.stack(parts) for parts in zip(*(self._state[rids[i]] for i in rows)))
            x = torch.cat((ctx, torch.stack([windows[i][t] for i in rows])), dim=1)
            p, (h, c) = self.module.step(x, (h, c))
            for j, i in enumerate(rows):
                self._state[rids[i]] = (x[j, -self.module.context:], h[j], c[j])
                probs[i].append(p[j])
        return [ExecResult(outputs={"speech": torch.stack(p) if p else torch.zeros(0)}) for p in probs]


def vad_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> VadExecutor:
    assert isinstance(module, SileroVad)
    return VadExecutor(module)
