"""`SamplingState`: what the sampler remembers about one request between decode steps.

One per request, created by the conductor/worker when the request starts decoding and
passed to `Sampler` (one per batch row) every step. It owns the request's random
generator (so a seeded request draws the same numbers whatever else is in the batch) and
the token history the penalties need.
"""
from __future__ import annotations

import secrets
from typing import Sequence

import torch

from runtime.model_executor.sampling.grammar import Constraint
from runtime.model_executor.sampling.params import SamplingParams


class SamplingState:
    """Per-request sampling state: params, a private torch.Generator, token history, and the matcher
    of the grammar the request's output follows on this node (`constraint`, None when it is free)."""

    def __init__(self, params: SamplingParams, prompt_ids: Sequence[int] = (),
                 device: torch.device | str = "cpu", constraint: Constraint | None = None) -> None:
        self.params = params
        self.constraint = constraint
        self.device = torch.device(device)
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.prompt_ids: list[int] = list(prompt_ids)
        self.output_ids: list[int] = []
        self._output_counts: torch.Tensor | None = None   # (V,) float32, only with penalties
        self._seen: torch.Tensor | None = None            # (V,) bool: in prompt or output

    def append(self, token_id: int) -> None:
        """Record a token the request produced (call once per sampled token)."""
        self.output_ids.append(int(token_id))
        if self.constraint is not None:
            self.constraint.accept(token_id)
        if self._output_counts is not None:
            self._output_counts[token_id] += 1.0
            self._seen[token_id] = True

    def undo_last(self) -> None:
        """Forget the last appended token: a Run's sample the request does not keep (a prompt read in
        pieces samples after each; only the last piece's token is the answer's)."""
        self.output_ids.pop()
        self._output_counts = self._seen = None          # rebuilt from the history when next asked
        if self.constraint is not None:
            self.constraint.rollback()

    def penalty_tensors(self, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(output counts (V,) float32, seen-in-prompt-or-output mask (V,) bool), built once."""
        if self._output_counts is None or self._output_counts.numel() != vocab_size:
            counts = torch.zeros(vocab_size, dtype=torch.float32, device=self.device)
            ids = torch.tensor(self.output_ids, dtype=torch.long, device=self.device)
            counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))
            seen = counts > 0
            seen[torch.tensor(self.prompt_ids, dtype=torch.long, device=self.device)] = True
            self._output_counts, self._seen = counts, seen
        return self._output_counts, self._seen
