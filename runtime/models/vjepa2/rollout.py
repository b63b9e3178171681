"""World-model rollout with the V-JEPA 2-AC predictor: cached (O(H)) and native (O(H^2)).

Shapes: P = tokens per frame (256 at 256 px), E = encoder width, A/S = action/state dims,
C = context frames, H = horizon. A rollout of horizon H from C context frames uses
C + H - 1 actions: action t is the one taken at frame t (actions[:C-1] between context
frames, actions[C-1:] the ones being evaluated). Prediction h (0-based) is frame C + h.

`rollout_step` is what the runtime calls once per batch step of the `rollout` walk's
DynamicLoop (see runtime/models/vjepa2/__init__.py); `cached_rollout` and `native_rollout` run a
whole batch to the horizon (tests, benchmarks, planning).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from torch.nn import functional as F

from runtime.models.vjepa2.frame_cache import FrameKVCache
from runtime.models.vjepa2.pose import state_update

if TYPE_CHECKING:
    from runtime.models.vjepa2.vjepa2_ac_predictor import Vjepa2ACPredictor


@dataclass
class Rollout:
    """One request's rollout state, kept by the worker between batch steps."""

    cache: FrameKVCache          # the predictor's keys/values of the steps fed so far
    actions: torch.Tensor        # (C + H - 1, A) every action of the rollout
    horizon: int                 # H: predictions to make
    next_frames: torch.Tensor    # (n * P, E) steps to feed next: the context, then the last prediction
    next_states: torch.Tensor    # (n, S) their states
    predictions: list[torch.Tensor] = field(default_factory=list)  # (P, E) per step made

    @property
    def is_done(self) -> bool:
        return len(self.predictions) >= self.horizon

    @property
    def num_next_steps(self) -> int:
        return self.next_states.shape[0]


def start_rollout(predictor: Vjepa2ACPredictor, context_frames: torch.Tensor, context_states: torch.Tensor,
                  actions: torch.Tensor, horizon: int) -> Rollout:
    """Admit one request: context_frames (C*P, E), context_states (C, S), actions (C+H-1, A)."""
    num_context = context_states.shape[0]
    if actions.shape[0] != num_context + horizon - 1:
        raise ValueError(f"a rollout of horizon {horizon} from {num_context} context frames needs "
                         f"{num_context + horizon - 1} actions, got {actions.shape[0]}")
    cache = predictor.new_cache(num_context + horizon - 1)
    return Rollout(cache, actions, horizon, context_frames, context_states)


@torch.inference_mode()
def rollout_step(predictor: Vjepa2ACPredictor, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
    """Advance every (unfinished) rollout by one predicted frame; return those frames (P, E).

    Requests that are still at their context (first step) and requests in steady state
    (one new frame step each) may be mixed: they run in one predictor call per distinct
    number of new steps, each request attending only to its own cache.
    """
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rollouts):
        groups.setdefault(r.num_next_steps, []).append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(rollouts)
    for n, members in groups.items():
        batch = [rollouts[i] for i in members]
        for i, frame in zip(members, _advance(predictor, batch, n)):
            out[i] = frame
    return out


def _advance(predictor: Vjepa2ACPredictor, batch: list[Rollout], n: int) -> list[torch.Tensor]:
    p = predictor.tokens_per_frame
    first = [r.cache.num_steps for r in batch]
    frames = torch.stack([r.next_frames for r in batch])                          # (B, n*P, E)
    actions = torch.stack([r.actions[s:s + n] for r, s in zip(batch, first)])     # (B, n, A)
    states = torch.stack([r.next_states for r in batch])                          # (B, n, S)
    pred = predictor(frames, actions, states, caches=[r.cache for r in batch])[:, -p:]  # (B, P, E)
    if predictor.args["normalize_reps"]:
        pred = F.layer_norm(pred, pred.shape[-1:])
    next_states = state_update(predictor.args["state_update"])(states[:, -1], actions[:, -1])  # (B, S)
    for r, frame, state in zip(batch, pred, next_states):
        r.predictions.append(frame)
        r.next_frames, r.next_states = frame, state[None]
    return list(pred)


def cached_rollout(predictor: Vjepa2ACPredictor, context_frames: torch.Tensor, context_states: torch.Tensor,
                   actions: torch.Tensor, horizons: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Batch rollout with the per-frame KV cache.

    context_frames (B, C*P, E), context_states (B, C, S), actions (B, C+H-1, A);
    `horizons` (per request, <= H; default H for all) lets requests stop early while the
    others continue in the same batch. Returns per request its predictions (h_b, P, E).
    """
    b, num_context = context_states.shape[:2]
    longest = actions.shape[1] - num_context + 1
    horizons = list(horizons) if horizons is not None else [longest] * b
    rollouts = [start_rollout(predictor, context_frames[i], context_states[i],
                              actions[i, :num_context + horizons[i] - 1], horizons[i]) for i in range(b)]
    while active := [r for r in rollouts if not r.is_done]:
        rollout_step(predictor, active)
    return [torch.stack(r.predictions) for r in rollouts]


@torch.inference_mode()
def native_rollout(predictor: Vjepa2ACPredictor, context_frames: torch.Tensor, context_states: torch.Tensor,
                   actions: torch.Tensor, horizon: int) -> torch.Tensor:
    """V-JEPA 2-AC's own rollout, restated from facebookresearch/vjepa2's action-conditioned
    planning code: re-run the predictor over the whole trajectory every step (the oracle of the
    cached rollout and the baseline of `tools/bench.py rollout`).

    Same arguments as `cached_rollout` (one horizon for the batch); returns (B, H, P, E).
    """
    p, num_context = predictor.tokens_per_frame, context_states.shape[1]
    update = state_update(predictor.args["state_update"])
    frames, states, preds = context_frames, context_states, []
    for h in range(horizon):
        n = num_context + h
        pred = predictor(frames, actions[:, :n], states)[:, -p:]               # (B, P, E)
        if predictor.args["normalize_reps"]:
            pred = F.layer_norm(pred, pred.shape[-1:])
        preds.append(pred)
        frames = torch.cat([frames, pred], dim=1)
        states = torch.cat([states, update(states[:, -1], actions[:, n - 1])[:, None]], dim=1)
    return torch.stack(preds, dim=1)
