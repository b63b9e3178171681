"""V-JEPA 2-AC world model: encoder tokens -> action-conditioned rollout -> planning.

Kinds: `vjepa2_encoder` (runtime/models/vjepa2/vjepa2_encoder.py) and `vjepa2_ac_predictor`
(runtime/models/vjepa2/vjepa2_ac_predictor.py). This package holds what they share and
what drives them: 3-axis RoPE (`rope`), the per-frame KV cache (`frame_cache`), pose
integration (`pose`), rollout (`rollout`) and CEM planning (`planning`).

Runtime interface of the `rollout` walk (a DynamicLoop over the horizon H):

  start_rollout(predictor, context_frames, context_states, actions, horizon) -> Rollout
      On admission. context_frames (C*P, E): the encoder's (normalised) tokens of the
      C context frames; context_states (C, S); actions (C+H-1, A). Reserves the
      request's KV cache for C+H-1 frame steps (predictor.new_cache); the conductor's
      memory check uses the catalogue's kv_bytes_per_token x tokens_per_step (P + 2).

  rollout_step(predictor, rollouts: Sequence[Rollout]) -> list[Tensor (P, E)]
      Once per batch step, with every active request of the node; returns each one's
      next predicted frame (stream it: the `prediction` port is a stream port) and
      appends it to `Rollout.predictions` (the accumulated output). The first step of a
      request feeds its C context frames; later steps feed only the last prediction
      (P + 2 tokens) and attend to the cache. Requests at different steps, with different
      context lengths or horizons, share a call; results equal per-request runs.

  Rollout.is_done   loop exit (H predictions made); then drop the Rollout (frees its cache).

Offline helpers: cached_rollout / native_rollout (whole batch to the horizon; the
native one is V-JEPA 2-AC's O(H^2) re-run, kept as the oracle and benchmark baseline)
and planning.plan_cem (goal-conditioned CEM over candidate action sequences).
"""
from __future__ import annotations

from runtime.models.vjepa2.frame_cache import FrameKVCache
from runtime.models.vjepa2.rollout import Rollout, cached_rollout, native_rollout, rollout_step, start_rollout

__all__ = ["FrameKVCache", "Rollout", "cached_rollout", "native_rollout", "rollout_step", "start_rollout"]
