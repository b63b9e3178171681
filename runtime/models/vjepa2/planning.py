"""Goal-conditioned planning with V-JEPA 2-AC: the cross-entropy method (CEM).

As the native planner (`cem` in the V-JEPA 2 notebooks) does: sample candidate action
trajectories from a Gaussian over the free action dims (x, y, z and gripper; rotation
deltas fixed to 0), roll each out with the world model, score the final predicted frame
against the goal frame's embedding by mean L1 distance, refit mean/std to the top-k
with momentum, and return the mean. The difference: all candidates of an iteration are
rolled out as one batch with the per-frame KV cache (`cached_rollout`) instead of
re-running the predictor over the whole trajectory at every step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from runtime.models.vjepa2.rollout import cached_rollout

if TYPE_CHECKING:
    from runtime.models.vjepa2.vjepa2_ac_predictor import Vjepa2ACPredictor

FREE_DIMS = (0, 1, 2, 6)  # x, y, z, gripper: the action dims CEM samples


@dataclass(frozen=True)
class CemConfig:
    """CEM settings; defaults are the native world model wrapper's."""

    horizon: int = 2             # actions planned = predicted frames
    samples: int = 400           # candidate trajectories per iteration
    topk: int = 10               # elites the distribution is refitted to
    iterations: int = 10         # "cem_steps"
    momentum_mean: float = 0.15  # weight of the old mean (xyz)
    momentum_std: float = 0.15   # weight of the old std (xyz)
    momentum_mean_gripper: float = 0.15
    momentum_std_gripper: float = 0.15
    maxnorm: float = 0.05        # bound on each xyz delta; also the initial xyz std
    gripper_bound: float = 0.75  # bound on the gripper delta


def l1_to_goal(final_frames: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
    """Mean absolute distance of final_frames (N, P, E) to goal (P, E) -> (N,)."""
    return (final_frames - goal).abs().flatten(1).mean(dim=1)


def score_candidates(predictor: Vjepa2ACPredictor, context_frames: torch.Tensor, context_states: torch.Tensor,
                     candidates: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
    """L1 to goal of each candidate's final predicted frame.

    context_frames (C*P, E), context_states (C, S), candidates (N, C+H-1, A) -> (N,).
    """
    n = candidates.shape[0]
    finals = cached_rollout(predictor, context_frames.expand(n, -1, -1), context_states.expand(n, -1, -1),
                            candidates)
    return l1_to_goal(torch.stack([f[-1] for f in finals]), goal)


def _sample(mean: torch.Tensor, std: torch.Tensor, cfg: CemConfig, generator: torch.Generator | None) -> torch.Tensor:
    """(samples, H, 7) candidate actions: free dims sampled and clipped, rotations 0."""
    free = torch.randn((cfg.samples, *mean.shape), generator=generator, device=mean.device) * std + mean
    bounds = torch.tensor([cfg.maxnorm] * 3 + [cfg.gripper_bound], device=mean.device)
    free = torch.maximum(torch.minimum(free, bounds), -bounds)
    actions = torch.zeros(cfg.samples, cfg.horizon, 7, device=mean.device)
    actions[..., list(FREE_DIMS)] = free
    return actions


def _refit(mean: torch.Tensor, std: torch.Tensor, elites: torch.Tensor, cfg: CemConfig
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Momentum update of (H, 4) mean/std towards the elites' (K, H, 4) statistics."""
    keep_mean = torch.tensor([cfg.momentum_mean] * 3 + [cfg.momentum_mean_gripper], device=mean.device)
    keep_std = torch.tensor([cfg.momentum_std] * 3 + [cfg.momentum_std_gripper], device=mean.device)
    new_mean = elites.mean(dim=0) * (1 - keep_mean) + mean * keep_mean
    new_std = elites.std(dim=0) * (1 - keep_std) + std * keep_std
    return new_mean, new_std


@torch.inference_mode()
def plan_cem(predictor: Vjepa2ACPredictor, context_frames: torch.Tensor, context_states: torch.Tensor,
             goal: torch.Tensor, cfg: CemConfig = CemConfig(), past_actions: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Plan cfg.horizon actions (H, 7) from context frames (C*P, E) / states (C, S) towards goal (P, E).

    past_actions (C-1, 7): the actions taken between the context frames (none for one frame).
    """
    device = goal.device
    past = past_actions if past_actions is not None else torch.zeros(0, 7, device=device)
    mean = torch.zeros(cfg.horizon, 4, device=device)
    std = torch.tensor([cfg.maxnorm] * 3 + [1.0], device=device).expand(cfg.horizon, 4).clone()
    for _ in range(cfg.iterations):
        actions = _sample(mean, std, cfg, generator)                                      # (N, H, 7)
        full = torch.cat([past.expand(cfg.samples, -1, -1), actions], dim=1)              # (N, C+H-1, 7)
        scores = score_candidates(predictor, context_frames, context_states, full, goal)
        elites = actions[scores.topk(cfg.topk, largest=False).indices][..., list(FREE_DIMS)]  # (K, H, 4)
        mean, std = _refit(mean, std, elites, cfg)
    plan = torch.zeros(cfg.horizon, 7, device=device)
    plan[:, :3] = mean[:, :3]
    plan[:, 6] = torch.where(mean[:, 3].abs() < 0.25, torch.zeros_like(mean[:, 3]), mean[:, 3])
    return plan
