"""Next end-effector state from (state, action), as V-JEPA 2-AC's rollout computes it.

State and action are 7-vectors [x, y, z, roll, pitch, yaw, gripper] (DROID). The native
planner (`compute_new_pose` in the V-JEPA 2 notebooks, via scipy) integrates an action
as: position += delta; orientation R_new = R(delta angles) @ R(angles) with extrinsic
"xyz" Euler angles; gripper += delta, clipped to [0, 1]. This is the same in torch, on
the batch, without leaving the device. "hold" keeps the state unchanged.
"""
from __future__ import annotations

from typing import Callable

import torch

StateUpdate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def euler_xyz_to_matrix(angles: torch.Tensor) -> torch.Tensor:
    """Extrinsic x-y-z Euler angles (..., 3) -> rotation matrices (..., 3, 3): Rz @ Ry @ Rx."""
    cx, cy, cz = angles.cos().unbind(-1)
    sx, sy, sz = angles.sin().unbind(-1)
    rows = [
        [cz * cy, cz * sy * sx - sz * cx, cz * sy * cx + sz * sx],
        [sz * cy, sz * sy * sx + cz * cx, sz * sy * cx - cz * sx],
        [-sy, cy * sx, cy * cx],
    ]
    return torch.stack([torch.stack(r, dim=-1) for r in rows], dim=-2)


def matrix_to_euler_xyz(m: torch.Tensor) -> torch.Tensor:
    """Inverse of `euler_xyz_to_matrix` (pitch in [-pi/2, pi/2]) -> (..., 3)."""
    pitch = torch.atan2(-m[..., 2, 0], torch.hypot(m[..., 0, 0], m[..., 1, 0]))
    roll = torch.atan2(m[..., 2, 1], m[..., 2, 2])
    yaw = torch.atan2(m[..., 1, 0], m[..., 0, 0])
    return torch.stack([roll, pitch, yaw], dim=-1)


def droid_pose(state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """state (..., 7), action (..., 7) -> next state (..., 7)."""
    xyz = state[..., :3] + action[..., :3]
    rotation = euler_xyz_to_matrix(action[..., 3:6].double()) @ euler_xyz_to_matrix(state[..., 3:6].double())
    angles = matrix_to_euler_xyz(rotation).to(state.dtype)
    gripper = (state[..., 6:] + action[..., 6:]).clamp(0.0, 1.0)
    return torch.cat([xyz, angles, gripper], dim=-1)


def hold(state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    return state


STATE_UPDATES: dict[str, StateUpdate] = {"droid_pose": droid_pose, "hold": hold}


def state_update(name: str) -> StateUpdate:
    if name not in STATE_UPDATES:
        raise ValueError(f"unknown state_update {name!r}; known: {sorted(STATE_UPDATES)}")
    return STATE_UPDATES[name]
