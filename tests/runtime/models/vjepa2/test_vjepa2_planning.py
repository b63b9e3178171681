"""Pose integration and CEM planning on top of the cached rollout."""
from __future__ import annotations

import math

import torch

from runtime.models.vjepa2.planning import CemConfig, l1_to_goal, plan_cem, score_candidates
from runtime.models.vjepa2.pose import droid_pose, euler_xyz_to_matrix, matrix_to_euler_xyz
from runtime.models.vjepa2.rollout import native_rollout
from tests.runtime.models.vjepa2.vjepa2_reference import make, randomize


def _elementary(axis: int, angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    i, j = [k for k in range(3) if k != axis]
    m = torch.eye(3, dtype=torch.float64)
    m[i, i], m[i, j], m[j, i], m[j, j] = c, -s, s, c
    return m if axis != 1 else m.T  # rotation about y: +sin sits at (0, 2)


def test_euler_convention_is_extrinsic_xyz():
    roll, pitch, yaw = 0.3, -0.7, 1.1
    want = _elementary(2, yaw) @ _elementary(1, pitch) @ _elementary(0, roll)
    got = euler_xyz_to_matrix(torch.tensor([roll, pitch, yaw], dtype=torch.float64))
    # float64, where torch's defaults are rtol 1e-7, atol 1e-7: products of the same sines and cosines in another
    # order (a few ulps of 2.2e-16); measured exact
    torch.testing.assert_close(got, want)
    # and back through atan2, a few float64 ulps again; measured exact
    torch.testing.assert_close(matrix_to_euler_xyz(got), torch.tensor([roll, pitch, yaw], dtype=torch.float64))


def test_droid_pose_composes_rotations_and_clips_the_gripper():
    g = torch.Generator().manual_seed(0)
    state = torch.cat([torch.randn(4, 6, generator=g) * 0.5, torch.full((4, 1), 0.9)], dim=1)
    action = torch.cat([torch.randn(4, 6, generator=g) * 0.2, torch.full((4, 1), 0.3)], dim=1)
    nxt = droid_pose(state, action)
    # the same fp32 additions: measured exact, inside torch's fp32 defaults (rtol 1.3e-6, atol 1e-5) anyway
    torch.testing.assert_close(nxt[:, :3], state[:, :3] + action[:, :3])
    rot = euler_xyz_to_matrix(action[:, 3:6].double()) @ euler_xyz_to_matrix(state[:, 3:6].double())
    # nxt's angles come back from the composed matrix in fp32 (eps 1.2e-7 of angles up to pi): a matrix rebuilt from
    # them is off by a few of those; measured max 2e-8, 0.1% of the bound
    torch.testing.assert_close(euler_xyz_to_matrix(nxt[:, 3:6].double()), rot, rtol=1e-5, atol=1e-5)
    assert torch.equal(nxt[:, 6], torch.ones(4))
    # composing with the identity, then fp32 matrix -> angles: measured exact, inside torch's fp32 defaults (an ulp)
    torch.testing.assert_close(droid_pose(state, torch.zeros_like(action))[:, :6], state[:, :6])


def _world(seed: int = 0):
    predictor = randomize(make("vjepa2_ac_predictor"), seed=seed)
    g = torch.Generator().manual_seed(seed + 2)
    frame = torch.nn.functional.layer_norm(torch.randn(16, 48, generator=g), (48,))
    state = torch.tensor([0.1, 0.0, 0.2, 0.0, 0.0, 0.0, 0.5])
    return predictor, frame, state[None]


def test_scores_are_native_rollout_l1():
    predictor, frame, state = _world()
    candidates = torch.randn(5, 3, 7, generator=torch.Generator().manual_seed(1)) * 0.05
    goal = torch.randn(16, 48, generator=torch.Generator().manual_seed(2))
    scores = score_candidates(predictor, frame, state, candidates, goal)
    finals = native_rollout(predictor, frame.expand(5, -1, -1), state.expand(5, -1, -1), candidates, 3)[:, -1]
    # the cached rollout against the native one over 3 steps (fp32 order differences), then an L1 sum over 768
    # values: measured max 1.2e-7 at |score| <= 1.1, 1% of the bound
    torch.testing.assert_close(scores, l1_to_goal(finals, goal), rtol=1e-5, atol=1e-6)


def test_cem_moves_towards_a_reachable_goal():
    """The goal is the world model's own prediction for a known action pair; the plan must
    land far closer to it than doing nothing does."""
    predictor, frame, state = _world()
    with torch.no_grad():
        predictor.action_encoder.weight *= 20  # so 5 cm moves change the random model's prediction
    target = torch.tensor([[0.05, -0.03, 0.02, 0, 0, 0, 0.6], [0.03, 0.05, -0.04, 0, 0, 0, 0.6]])
    goal = native_rollout(predictor, frame[None], state[None], target[None], 2)[0, -1]
    cfg = CemConfig(horizon=2, samples=48, topk=6, iterations=4)
    plan = plan_cem(predictor, frame, state, goal, cfg, generator=torch.Generator().manual_seed(3))
    assert plan.shape == (2, 7) and torch.equal(plan[:, 3:6], torch.zeros(2, 3))
    assert (plan[:, 6] > 0.25).all()  # the gripper move is found (and survives the 0.25 rounding)
    planned, idle = score_candidates(predictor, frame, state, torch.stack([plan, torch.zeros(2, 7)]), goal)
    assert planned < 0.1 * idle, (planned, idle)
