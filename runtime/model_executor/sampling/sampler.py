"""`Sampler`: a batch of logits (B, V) and one `SamplingState` per row -> one token per row.

Called by the worker after every LM forward that ends a decode step. Per row, in order:
penalties (repetition over prompt + output; presence and frequency over the output), the
grammar's mask on constrained rows (grammar.py: disallowed tokens at -inf), then greedy
argmax (temperature 0) or temperature -> top-k -> top-p -> min-p -> a draw.

Invariant: row i's result depends only on logits[i] and states[i]. Draws use the
exponential race (argmax p / E with E ~ Exp(1), which picks token t with probability
p_t) with noise from the row's own generator, so a seeded request yields the same tokens
whatever else shares the batch. Logprobs are those of the model's distribution
(log_softmax of the raw logits), as OpenAI reports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.model_executor.sampling.grammar import mask_rows
from runtime.model_executor.sampling.state import SamplingState


@dataclass
class SamplerOutput:
    """What one sampling step produced for a batch of B rows."""

    token_ids: torch.Tensor                 # (B,) int64: the chosen tokens
    logprobs: torch.Tensor | None = None    # (B,) float32: log p(chosen), None if no row asked
    top_ids: torch.Tensor | None = None     # (B, N) int64, N = largest `logprobs` asked in the batch;
    top_logprobs: torch.Tensor | None = None  # (B, N) float32; row i uses its first params.logprobs

    def row_logprobs(self, row: int, num_top: int | None) -> tuple[float, list[int], list[float]] | None:
        """Row `row`'s (log p(chosen), top ids, top log-probs) for a request asking `num_top`
        alternatives; None when it asked for none (num_top None)."""
        if num_top is None or self.logprobs is None:
            return None
        if num_top == 0 or self.top_ids is None:
            return float(self.logprobs[row]), [], []
        return (float(self.logprobs[row]), self.top_ids[row, :num_top].tolist(),
                self.top_logprobs[row, :num_top].tolist())


class Sampler:
    """Stateless across steps: all per-request memory lives in `SamplingState`."""

    def __call__(self, logits: torch.Tensor, states: Sequence[SamplingState]) -> SamplerOutput:
        """One token per row of `logits` (B, V), row i sampled with `states[i]` (not mutated:
        the caller appends the chosen token to its state once it accepts it)."""
        if logits.dim() != 2 or logits.shape[0] != len(states):
            raise ValueError(f"logits must be (B, V) with B = {len(states)} states, got {tuple(logits.shape)}")
        raw = logits.float()
        processed = mask_rows(apply_penalties(raw, states), [s.constraint for s in states])
        # greedy rows keep this (the CPU kernel: torch's argmax runs a row on one thread, the kernel reads each
        # row in vector lanes and spreads the rows over the worker's threads)
        token_ids = cpu_kernels.argmax(processed) if cpu_kernels.usable(processed) else torch.argmax(processed, -1)
        sampled_rows = [i for i, s in enumerate(states) if not s.params.is_greedy]
        if sampled_rows:
            rows = torch.tensor(sampled_rows, device=logits.device)
            probs = filtered_probs(processed[rows], [states[i] for i in sampled_rows])
            token_ids[rows] = exponential_race(probs, [states[i].generator for i in sampled_rows])
        return _with_logprobs(SamplerOutput(token_ids), raw, states)


def apply_penalties(logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
    """Repetition / presence / frequency penalties on the rows that ask for them; (B, V)."""
    rows = [i for i, s in enumerate(states) if s.params.has_penalties]
    if not rows:
        return logits
    out = logits.clone()
    vocab = logits.shape[-1]
    counts, seen = zip(*(states[i].penalty_tensors(vocab) for i in rows))
    counts, seen = torch.stack(counts), torch.stack(seen)     # (R, V)
    params = [states[i].params for i in rows]
    rep = _column(params, "repetition_penalty", logits)         # (R, 1)
    presence = _column(params, "presence_penalty", logits)
    frequency = _column(params, "frequency_penalty", logits)
    x = out[rows]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - frequency * counts - presence * (counts > 0).float()
    out[rows] = x
    return out


def filtered_probs(logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p as one sorted pass; probabilities (R, V)."""
    params = [s.params for s in states]
    logits = logits / _column(params, "temperature", logits)
    probs = torch.softmax(logits, dim=-1)
    if all(p.effective_top_k == 0 and p.top_p == 1.0 and p.min_p == 0.0 for p in params):
        return probs
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)   # (R, V)
    keep = _keep_sorted(sorted_probs, params)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs * keep)
    return kept / kept.sum(dim=-1, keepdim=True)


def _keep_sorted(sorted_probs: torch.Tensor, params: Sequence) -> torch.Tensor:
    """Mask (R, V) over descending-sorted probs: the prefix top-k, top-p and min-p all keep."""
    vocab = sorted_probs.shape[-1]
    device = sorted_probs.device
    rank = torch.arange(vocab, device=device).unsqueeze(0)                    # (1, V)
    top_k = torch.tensor([min(p.effective_top_k or vocab, vocab) for p in params], device=device)  # never past int64
    keep = rank < top_k.unsqueeze(1)
    # top-p on the distribution renormalised after top-k; a token stays while the mass before it < top_p
    after_k = sorted_probs * keep
    after_k = after_k / after_k.sum(dim=-1, keepdim=True)
    mass_before = torch.cumsum(after_k, dim=-1) - after_k
    top_p = _column(params, "top_p", sorted_probs)
    keep &= (mass_before < top_p) | (top_p >= 1.0)    # 1.0 is off, whatever the rounding of the sums
    keep &= sorted_probs >= _column(params, "min_p", sorted_probs) * sorted_probs[:, :1]
    keep[:, 0] = True                                                          # never empty
    return keep


def exponential_race(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One draw per row of `probs` (R, V), row r using only `generators[r]`; (R,) int64."""
    noise = torch.empty_like(probs)
    for r, gen in enumerate(generators):
        noise[r].exponential_(generator=gen)
    return torch.argmax(probs / noise.clamp_min_(torch.finfo(probs.dtype).tiny), dim=-1)


def _with_logprobs(out: SamplerOutput, raw: torch.Tensor, states: Sequence[SamplingState]) -> SamplerOutput:
    wanted = [s.params.logprobs for s in states if s.params.logprobs is not None]
    if not wanted:
        return out
    logprobs = torch.log_softmax(raw, dim=-1)                                  # (B, V)
    out.logprobs = logprobs.gather(-1, out.token_ids.unsqueeze(-1)).squeeze(-1)
    top_n = max(wanted)
    if top_n > 0:
        out.top_logprobs, out.top_ids = torch.topk(logprobs, top_n, dim=-1)
    return out


def _column(params: Sequence, name: str, like: torch.Tensor) -> torch.Tensor:
    """One float per row as a (R, 1) column for broadcasting against (R, V)."""
    return torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=like.device).unsqueeze(1)
