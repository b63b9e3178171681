"""V-JEPA 2-AC as Meta's code computes it: the native side of the `vjepa2-g` benchmark and the reference side
of tests/runtime/models/vjepa2/test_vjepa2_meta_parity.py.

Imports torch, numpy and Meta's `vjepa2` package, nothing of mstar's. The package is PyPI's
`cc-vjepa2` 0.0.3 (facebookresearch/vjepa2's `src/` as an installable package): its
`models/ac_predictor.py` is upstream's file byte for byte but for the import path, and its
`models/utils/modules.py` differs from upstream's only in passing dropout_p=0 outside training
(upstream passes the configured 0.0 anyway). It is installed with --no-deps (Makefile, setup.cfg):
its declared torchvision is a CUDA build that fails to import beside the CPU torch, and the one
name Meta's modules.py takes from timm (which needs torchvision) is `drop_path`, stochastic depth,
which a predictor built with drop_path_rate=0 never calls; `_stand_in_for_timm` provides that name.

The rollout loop is restated from upstream's notebooks/utils/world_model_wrapper.py
(`step_predictor`) and mpc_utils.py (`compute_new_pose`), which the package does not carry; the
pose update is restated in numpy because scipy's `Rotation` is not installed here.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any, Mapping

import numpy as np
import torch
from torch.nn import functional as F


def _stand_in_for_timm() -> None:
    """Register `timm.models.layers.drop_path` when timm is not installed (see module docstring)."""
    if importlib.util.find_spec("timm") is not None:
        return

    def drop_path(x: torch.Tensor, drop_prob: float = 0.0, training: bool = False) -> torch.Tensor:
        raise NotImplementedError("stochastic depth: build the reference predictor with drop_path_rate=0")

    layers = types.ModuleType("timm.models.layers")
    layers.drop_path = drop_path
    for name, module in (("timm", types.ModuleType("timm")), ("timm.models", types.ModuleType("timm.models")),
                         ("timm.models.layers", layers)):
        sys.modules.setdefault(name, module)


_stand_in_for_timm()
from vjepa2.hub.backbones import vjepa2_ac_vit_giant  # noqa: E402
from vjepa2.models.ac_predictor import VisionTransformerPredictorAC, vit_ac_predictor  # noqa: E402


def meta_predictor(dims: Mapping[str, Any], max_steps: int) -> VisionTransformerPredictorAC:
    """Meta's `vit_ac_predictor` (LayerNorm eps 1e-6, MLP ratio 4, q/k/v bias) at `dims`, in eval mode.

    Meta builds its block-causal mask once for num_frames // tubelet_size frame steps: room for
    `max_steps`.
    """
    assert dims["intermediate_size"] == 4 * dims["hidden_size"] and dims["action_dim"] == dims["state_dim"]
    return vit_ac_predictor(
        img_size=dims["image_size"], patch_size=dims["patch_size"], num_frames=max_steps * dims["tubelet_size"],
        tubelet_size=dims["tubelet_size"], embed_dim=dims["embed_dim"], predictor_embed_dim=dims["hidden_size"],
        depth=dims["num_hidden_layers"], num_heads=dims["num_attention_heads"],
        action_embed_dim=dims["action_dim"]).eval()


def _euler_xyz_matrix(angles: np.ndarray) -> np.ndarray:
    """scipy's Rotation.from_euler("xyz", angles).as_matrix() (extrinsic axes: Rz @ Ry @ Rx), (B, 3) -> (B, 3, 3)."""
    def axis(i: int, a: np.ndarray) -> np.ndarray:
        c, s = np.cos(a), np.sin(a)
        m = np.tile(np.eye(3), (len(a), 1, 1))
        j, k = [n for n in range(3) if n != i]
        m[:, j, j], m[:, j, k], m[:, k, j], m[:, k, k] = c, -s, s, c
        return m if i != 1 else m.transpose(0, 2, 1)   # about y the sine's sign flips
    return axis(2, angles[:, 2]) @ axis(1, angles[:, 1]) @ axis(0, angles[:, 0])


def _matrix_euler_xyz(m: np.ndarray) -> np.ndarray:
    """scipy's Rotation.from_matrix(m).as_euler("xyz") away from gimbal lock, (B, 3, 3) -> (B, 3)."""
    return np.stack([np.arctan2(m[:, 2, 1], m[:, 2, 2]), np.arcsin(np.clip(-m[:, 2, 0], -1.0, 1.0)),
                     np.arctan2(m[:, 1, 0], m[:, 0, 0])], axis=-1)


def compute_new_pose(pose: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """mpc_utils.compute_new_pose: pose (B, 7), action (B, 7) -> next pose (B, 7), in float64 numpy."""
    p, a = pose.double().numpy(), action.double().numpy()
    rotation = _euler_xyz_matrix(a[:, 3:6]) @ _euler_xyz_matrix(p[:, 3:6])
    gripper = np.clip(p[:, 6:] + a[:, 6:], 0, 1)
    new = np.concatenate([p[:, :3] + a[:, :3], _matrix_euler_xyz(rotation), gripper], axis=-1)
    return torch.from_numpy(new).to(pose.dtype)


@torch.no_grad()
def world_model_rollout(predictor: VisionTransformerPredictorAC, frames: torch.Tensor, states: torch.Tensor,
                        actions: torch.Tensor, horizon: int) -> torch.Tensor:
    """The world model's `step_predictor` run `horizon` times, each over the whole trajectory so far.

    frames (B, C*P, E) layer-normed context tokens, states (B, C, 7), actions (B, C+H-1, 7)
    -> predictions (B, H, P, E), each layer-normed (normalize_reps) and fed back.
    """
    tokens_per_frame = predictor.grid_height * predictor.grid_width
    num_context, preds = states.shape[1], []
    for h in range(horizon):
        n = num_context + h
        step_actions = actions[:, :n]
        next_rep = predictor(frames, step_actions, states)[:, -tokens_per_frame:]     # (B, P, E)
        next_rep = F.layer_norm(next_rep, (next_rep.size(-1),))
        next_pose = compute_new_pose(states[:, -1], step_actions[:, -1])
        preds.append(next_rep)
        frames = torch.cat([frames, next_rep], dim=1)
        states = torch.cat([states, next_pose[:, None]], dim=1)
    return torch.stack(preds, dim=1)


def meta_ac_vitg() -> tuple[torch.nn.Module, VisionTransformerPredictorAC]:
    """Meta's V-JEPA 2-AC ViT-g/16 encoder and 24-layer predictor as its hub entry builds them
    (`vjepa2_ac_vit_giant`, 256 px, 64 frames), with their own random initialisation, in eval mode."""
    encoder, predictor = vjepa2_ac_vit_giant(pretrained=False)
    return encoder.eval(), predictor.eval()


@torch.no_grad()
def meta_world_model(encoder: torch.nn.Module, predictor: VisionTransformerPredictorAC, clip: torch.Tensor,
                     states: torch.Tensor, actions: torch.Tensor, horizon: int) -> torch.Tensor:
    """The world model's rollout: the context clip (B, 3, T, H, W) encoded and layer-normed (as the world-model
    wrapper's encode does), then `world_model_rollout` -> predictions (B, horizon, P, E)."""
    frames = encoder(clip)
    frames = F.layer_norm(frames, (frames.size(-1),))
    return world_model_rollout(predictor, frames, states, actions, horizon)
