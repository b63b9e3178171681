"""Orpheus TTS on the worker: the LM that speaks in audio tokens, and the streamed SNAC decode.

`OrpheusLMExecutor` is the decoder-LM executor with one rule added: the token at stream
position p (p-th sampled token of the request) is sampled only among the 4096 audio ids
of p's slot in its SNAC frame (ids offset + 4096 * (p mod 7) + code), and end-of-speech
only at a frame boundary. A trained Orpheus emits exactly these tokens anyway; the rule
keeps a window from ever decoding to silence because one token strayed (Orpheus drops
such windows), and makes seeded random weights speak real SNAC codes.

`SnacExecutor` runs the `per_chunk` vocoder track: each Run receives one chunk of the
`audio_tokens` stream (sliding window 28, stride 7) and the batch decodes every request's
window at once (`SnacDecoder.decode_chunks`), returning each request's new samples.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from mstar_compiler.plan import Node, Plan
from runtime.worker.executors import CachelessExecutor, ExecResult
from runtime.models.decoder_lm.executors import DecoderLMExecutor
from runtime.model_executor.sampling import GrammarVocab, Sampler, SamplerOutput, SamplingState
from runtime.streams.chunk_policy import Chunk
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams

END_OF_SPEECH = 128258   # Orpheus' default, overridden by the request's `end_of_speech` param


class _AudioSlots:
    """Samples each row among the ids its stream position allows (the module docstring's rule).

    The LM's `compute_logits` is replaced by candidate logits (B, C + 1): the C ids of the
    row's frame slot, then end-of-speech (-inf off frame boundaries). Only those C + 1
    columns of the head are computed (the whole vocabulary under tensor parallelism), and
    sampling sorts C + 1 values instead of the vocabulary; the sampler's ids are mapped
    back to vocabulary ids.
    """

    def __init__(self, lm: nn.Module, sampler: Sampler, offset: int, codebook_size: int, per_frame: int) -> None:
        self.lm, self.sampler = lm, sampler
        self.offset, self.codebook_size, self.per_frame = offset, codebook_size, per_frame
        self.rows: list[tuple[int, int]] = []   # per batch row: (stream position, end-of-speech id)

    def _range(self, position: int) -> int:
        return self.offset + self.codebook_size * (position % self.per_frame)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        c = self.codebook_size
        out = torch.full((hidden.shape[0], c + 1), float("-inf"), device=hidden.device)   # (B, C + 1)
        full = self.lm.compute_logits(hidden) if self.lm.tp.size > 1 else None
        head = self.lm.lm_head
        slots: dict[int, list[int]] = {}
        for row, (position, _) in enumerate(self.rows):
            slots.setdefault(position % self.per_frame, []).append(row)
        for slot, rows in slots.items():            # rows of one frame slot share their C columns
            lo = self.offset + c * slot
            idx = torch.tensor(rows, device=hidden.device)
            out[idx, :c] = full[idx, lo:lo + c] if full is not None else head.columns(hidden[idx], lo, lo + c).float()
            if slot == 0:
                stops = torch.tensor([self.rows[r][1] for r in rows], device=hidden.device)
                out[idx, c] = full[idx, stops] if full is not None else (hidden[idx] * head.rows(stops)).sum(-1).float()
        return out

    def __call__(self, logits: torch.Tensor, states: Sequence[SamplingState]) -> SamplerOutput:
        if any(s.params.has_penalties for s in states):
            raise ValueError("Orpheus speech samples among audio tokens only: repetition, presence and "
                             "frequency penalties are not supported")
        out = self.sampler(logits, states)
        lo = torch.tensor([self._range(p) for p, _ in self.rows], device=logits.device)
        stop = torch.tensor([s for _, s in self.rows], device=logits.device)
        out.token_ids = torch.where(out.token_ids == self.codebook_size, stop, lo + out.token_ids)
        return out


class _SlotLM(nn.Module):
    """The LM with `compute_logits` answered by `_AudioSlots`."""

    def __init__(self, lm: nn.Module, slots: _AudioSlots) -> None:
        super().__init__()
        self.lm = lm
        self.slots = [slots]   # a list: not a submodule

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.lm(*args, **kwargs)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.slots[0].compute_logits(hidden)


class OrpheusLMExecutor(DecoderLMExecutor):
    """A `llama_lm` node that feeds a `snac_decoder` stream (see the module docstring)."""

    def __init__(self, node: Node, model: nn.Module, rank: int, snac_dims: Mapping[str, Any]) -> None:
        super().__init__(node, model, rank)
        self.slots = _AudioSlots(model, self.sampler, int(snac_dims["audio_token_offset"]),
                                 int(snac_dims["codebook_size"]), int(snac_dims["tokens_per_frame"]))
        self.model, self.sampler = _SlotLM(model, self.slots), self.slots
        self._num_sampled: dict[int, int] = {}
        self._stops: dict[int, int] = {}

    def open(self, request_id: int, params: RequestParams) -> None:
        super().open(request_id, params)
        self._stops[request_id] = int(params.declared.get("end_of_speech", END_OF_SPEECH))

    def take_vocab(self, vocab: GrammarVocab) -> bool:
        return False         # it samples among audio slots, not the text vocabulary a grammar is written in

    def close(self, request_id: int, kv_only: bool) -> None:
        super().close(request_id, kv_only)
        if not kv_only:
            self._num_sampled.pop(request_id, None)
            self._stops.pop(request_id, None)

    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]:
        self.slots.rows = [(self._position(i), self._stops.get(i.request_id, END_OF_SPEECH)) for i in items]
        results = super().run(items, inputs)
        for item in items:
            self._num_sampled[item.request_id] = self._position(item) + 1
        return results

    def _position(self, item: WorkItem) -> int:
        """The stream index of the token this Run samples: the conductor's route says it (prefill
        and decode may run on different ranks); without a route, this rank's own count."""
        return item.stream_out[0].index if item.stream_out else self._num_sampled.get(item.request_id, 0)


class SnacExecutor(CachelessExecutor):
    """The `snac_decoder` node: one streamed token window per request per Run, batched."""

    def __init__(self, node: Node, module: nn.Module) -> None:
        self.node = node
        self.module = module

    @torch.inference_mode()
    def run(self, items: list[WorkItem], inputs: list[dict[str, Any]]) -> list[ExecResult]:
        chunks: list[Chunk] = [ins["codes"][0] if ins.get("codes") else Chunk([], 0, 0, True) for ins in inputs]
        tokens = [torch.cat([it["value"].reshape(-1) for it in c.items]) if c.items
                  else torch.zeros(0, dtype=torch.long) for c in chunks]
        audio = self.module.decode_chunks(tokens, [c.start for c in chunks], [c.num_context for c in chunks],
                                          [c.is_final for c in chunks])
        return [ExecResult(outputs={"audio": a.float().cpu()}) for a in audio]


def orpheus_lm_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> OrpheusLMExecutor:
    """The LM of an Orpheus graph: its audio token ids come from the SNAC node it streams into."""
    snac = next((plan.node(s.dst_node) for s in plan.streams if s.src_node == node.name), None)
    if snac is None:
        raise ValueError(f"node '{node.name}' ({node.source}) runs executor orpheus_lm but streams into no "
                         f"snac_decoder node: add a stream from {node.name}.token to the decoder's codes")
    return OrpheusLMExecutor(node, module, rank, snac.dims)


def snac_executor(plan: Plan, node: Node, module: nn.Module, rank: int) -> SnacExecutor:
    return SnacExecutor(node, module)
