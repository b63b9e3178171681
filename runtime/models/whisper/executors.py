"""Whisper on the worker: the encoder's windows as one batch, and the decoder as a decoder LM whose
prompt starts with its cross-attention memory (runtime/models/whisper/whisper_decoder.py).

`DecoderExecutor` is the generic decoder-LM executor with three things of Whisper's: the memory
placeholder (`<|nospeech|>`, never in a text prompt) marks the rows the encoder's output fills, and
`<|startoflm|>` rows after them pad the memory to whole KV blocks; the positions it gives the model count
a request's tokens after those rows; and a
request whose prompt ends at <|startoftranscript|> has its language picked by the model among the
language tokens only, then the task token and (without timestamps) <|notimestamps|> follow as its
request asked (`RequestParams.family`: "task", "timestamps"), as transformers' Whisper generate does
after detecting a language. A window's first token of its own is never one of the dims'
`begin_suppress_tokens` (the published generation config's: " " and end of text); a request asking for
timestamps writes under Whisper's timestamp rules (runtime/models/whisper/timestamps.py).
"""
from __future__ import annotations

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.models.decoder_lm.executors import DecoderLMExecutor
from runtime.models.whisper.timestamps import apply_timestamp_rules
from runtime.models.whisper.tokens import WhisperTokens
from runtime.model_executor.parallel.cpu_linear import device_of
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.executors import CachelessExecutor, ExecResult


class EncoderExecutor(CachelessExecutor):
    """The `whisper_encoder` node: every window of a batch through one call."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.device = device_of(module)

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        mel = torch.stack([self.module.features(ins["audio"].to(self.device)) for ins in inputs])
        hidden = self.module(mel)                                       # (B, 1500, d_model)
        return [ExecResult(outputs={"hidden": hidden[b]}) for b in range(len(items))]


class DecoderExecutor(DecoderLMExecutor):
    """The `whisper_decoder` node (module docstring)."""

    def __init__(self, node: Node, model: nn.Module, rank: int, plan: Plan) -> None:
        self.tokens = WhisperTokens.of(node.dims)
        self.placeholder_ids = frozenset({self.tokens.no_speech})
        super().__init__(node, model, rank, plan, prefix_cache=True)
        self._memory: dict[int, tuple[int, int]] = {}  # request -> its memory rows, and those and their padding
        self._region_ids = frozenset({self.tokens.no_speech, self.tokens.start_of_lm})
        self._forced: dict[int, list[int]] = {}        # request -> tokens after the language it has picked
        self._asks: dict[int, tuple[str, bool]] = {}   # request -> (task, timestamps)
        self.begin_suppress = [int(t) for t in node.dims.get("begin_suppress_tokens", ())]
        max_initial = node.args.get("max_initial_timestamp_index")
        self.max_initial = None if max_initial is None else int(max_initial)

    def open(self, request_id: int, params: RequestParams) -> None:
        super().open(request_id, params)
        self._asks[request_id] = (str(params.family.get("task", "transcribe")),
                                  bool(params.family.get("timestamps", False)))

    def close(self, request_id: int, kv_only: bool) -> None:
        super().close(request_id, kv_only)
        if not kv_only:
            for held in (self._memory, self._forced, self._asks):
                held.pop(request_id, None)

    def positions(self, item: WorkItem, start: int) -> torch.Tensor:
        """(2, n): each new row's learned position (-1 at a memory row, -2 at a padding row after them) and
        the request's memory rows (runtime/models/whisper/whisper_decoder.py)."""
        rid, new = item.request_id, item.tokens[item.cached:]
        if rid not in self._memory or start == 0:
            region = next((i for i, t in enumerate(item.tokens) if t not in self._region_ids), len(item.tokens))
            self._memory[rid] = (sum(1 for t in item.tokens[:region] if t == self.tokens.no_speech), region)
            if item.tokens[-1] == self.tokens.sot:
                self._forced[rid] = self.tokens.forced_after_language(*self._asks.get(rid, ("transcribe", False)))
        memory, region = self._memory[rid]
        learned = [(-1 if t == self.tokens.no_speech else -2) if start + i < region else start + i - region
                   for i, t in enumerate(new)]
        return torch.tensor([learned, [memory] * len(new)], dtype=torch.long, device=self.device)

    def _forward(self, items: list[WorkItem], starts: list[int], inputs: list[dict[str, torch.Tensor]],
                 sampling: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        logits, hidden = super()._forward(items, starts, inputs, sampling)
        for row, b in enumerate(sampling):
            rid = items[b].request_id
            state = self._states.get(rid)
            written = list(state.output_ids) if state is not None else []
            forced = self._forced.get(rid)
            told = 0 if forced is None else 1 + len(forced)     # the language and what follows it
            if len(written) < told:
                logits[row] = self._told(logits[row], forced, len(written))
                continue
            if len(written) == told and self.begin_suppress:     # the window's first token of its own
                logits[row, self.begin_suppress] = float("-inf")
            if self._asks.get(rid, ("transcribe", False))[1]:
                logits[row] = apply_timestamp_rules(logits[row], written[told:], self.tokens, self.max_initial)
        return logits, hidden

    def _told(self, row: torch.Tensor, forced: list[int], made: int) -> torch.Tensor:
        """The row as the model may write its `made`-th token after <|startoftranscript|>: a language of its
        choice first, then the forced tokens."""
        keep = torch.full_like(row, float("-inf"))
        if made == 0:
            first, n = self.tokens.first_language, self.tokens.num_languages
            keep[first:first + n] = row[first:first + n]
        else:
            keep[forced[made - 1]] = 0.0
        return keep

def encoder_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> EncoderExecutor:
    return EncoderExecutor(module)


def decoder_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> DecoderExecutor:
    return DecoderExecutor(node, module, rank, plan)
