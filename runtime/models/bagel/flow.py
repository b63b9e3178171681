"""BAGEL's rectified-flow sampling schedule.

N timesteps give N-1 Euler steps: t_i = 1 - i/(N-1) (i = 0..N-1), shifted to
s*t / (1 + (s-1)*t). Step i moves the latent from t_i to t_{i+1} with
x <- x - v(x, t_i) * (t_i - t_{i+1}); t = 1 is pure noise, t = 0 the image.
"""
from __future__ import annotations

import torch


def shift_timesteps(t: torch.Tensor, shift: float) -> torch.Tensor:
    """BAGEL's timestep shift s*t / (1 + (s-1)*t); shift > 1 spends more steps near noise."""
    return shift * t / (1 + (shift - 1) * t)


def flow_timesteps(num_timesteps: int, shift: float) -> torch.Tensor:
    """The N shifted timesteps t_0 = 1 > ... > t_{N-1} = 0 (float32, shape (N,))."""
    if num_timesteps < 2:
        raise ValueError(f"num_timesteps must be at least 2 (one Euler step), got {num_timesteps}")
    return shift_timesteps(torch.linspace(1, 0, num_timesteps), shift)


def flow_step_times(num_timesteps: int, shift: float, step: int) -> tuple[float, float]:
    """(t_i, t_{i+1}) of Euler step `step` in 0..N-2: the `timestep` and `timestep_next` inputs."""
    t = flow_timesteps(num_timesteps, shift)
    if not 0 <= step < num_timesteps - 1:
        raise ValueError(f"step {step} is outside 0..{num_timesteps - 2}")
    return float(t[step]), float(t[step + 1])
