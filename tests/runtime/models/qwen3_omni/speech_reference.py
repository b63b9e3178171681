"""A reference talker loop for tests: one step for a batch (`speak_step`) and whole requests (`generate_frames`).

`speak_step` is the talker iteration the served nodes split between them (runtime/models/qwen3_omni/executors.py:
`TalkerExecutor`, `CodePredictorExecutor`): the talker forward over the batch's packed rows (prefill chunks and
decode rows), codebook 0 sampled from the speakable ids, then the code predictor's inner loop for every request
that did not say EOS. `generate_frames` drives whole requests with its own paged cache and allocator (a
reference, compared with transformers' generate, not served code); the conductor does the same interleaved with
the thinker and code2wav (runtime/models/qwen3_omni/__init__.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from runtime.model_executor.attention import AttentionMetadata
from runtime.model_executor.kv import KVBlockManager, PagedKVCache
from runtime.models.qwen3_omni.qwen3_omni_code_predictor import Qwen3OmniCodePredictor, Sample, greedy
from runtime.models.qwen3_omni.talker_prompt import TalkerText

if TYPE_CHECKING:
    from runtime.models.qwen3_omni.qwen3_omni_talker import Qwen3OmniTalker


@dataclass
class SpeechStep:
    """What one talker step produced for B requests."""

    code0: torch.Tensor        # (B,) codebook 0, or codec EOS
    is_eos: torch.Tensor       # (B,) bool: the request has finished speaking (no frame)
    frames: torch.Tensor       # (B, num_code_groups) the spoken frames (rows of EOS requests: zeros)
    frame_embed: torch.Tensor  # (B, hidden_size) the frame's summed codec embedding (next input minus text)


@torch.no_grad()
def speak_step(talker: Qwen3OmniTalker, predictor: Qwen3OmniCodePredictor, rows: torch.Tensor, positions: torch.Tensor,
               batch: AttentionMetadata, cache: PagedKVCache, sample: Sample | None = None,
               sample_residual: Sample | None = None) -> SpeechStep:
    """Talker forward over packed `rows` (N, hidden), codebook 0 per request, residual codebooks."""
    hidden = talker(rows, positions, batch, cache)[batch.last_token_rows()]  # (B, H)
    logits = talker.compute_logits(hidden).masked_fill(~talker.speakable(), float("-inf"))
    code0 = (sample or greedy)(logits)
    is_eos = code0 == talker.dims["codec_eos_token_id"]
    frames = torch.zeros(len(code0), predictor.num_code_groups, dtype=torch.long, device=code0.device)
    frame_embed = torch.zeros_like(hidden)
    speaking = (~is_eos).nonzero().flatten()
    if len(speaking):
        prefix = torch.stack((hidden[speaking], talker.embed_codes(code0[speaking])), dim=1)  # (B', 2, H)
        frames[speaking], frame_embed[speaking] = predictor.predict_frames(prefix, code0[speaking], sample_residual)
    return SpeechStep(code0, is_eos, frames, frame_embed)


@torch.no_grad()
def generate_frames(talker: Qwen3OmniTalker, predictor: Qwen3OmniCodePredictor, prompts: Sequence[torch.Tensor], texts: Sequence[TalkerText],
                    max_frames: int, block_size: int = 16) -> list[torch.Tensor]:
    """Codec frames (F_i, num_code_groups) per request, all requests batched each step.

    prompts[i] (P_i, hidden) are talker prefill rows (`talker_prompt`); texts[i] must
    already be finished or hold enough rows (this loop does not wait for a thinker).
    """
    need = max(p.shape[0] for p in prompts) + max_frames
    num_blocks = len(prompts) * -(-need // block_size)
    manager, cache = KVBlockManager(num_blocks, block_size), talker.make_kv_cache(num_blocks, block_size)
    frames: list[list[torch.Tensor]] = [[] for _ in prompts]
    rows, live = list(prompts), list(range(len(prompts)))
    while live:
        for i in live:
            (manager.append if i in manager else manager.allocate)(i, rows[i].shape[0])
        batch = manager.metadata([(i, rows[i].shape[0]) for i in live])
        positions = torch.cat([torch.arange(manager.num_tokens(i) - rows[i].shape[0], manager.num_tokens(i))
                               for i in live])
        step = speak_step(talker, predictor, torch.cat([rows[i] for i in live]), positions, batch, cache)
        for j, i in enumerate(list(live)):
            if not step.is_eos[j]:
                frames[i].append(step.frames[j])
                rows[i] = (step.frame_embed[j] + texts[i].next_row())[None]  # (1, H)
            if step.is_eos[j] or len(frames[i]) == max_frames:
                live.remove(i)
                manager.free(i)
    return [torch.stack(f) if f else torch.zeros(0, predictor.num_code_groups, dtype=torch.long) for f in frames]
