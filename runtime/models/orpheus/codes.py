"""Orpheus audio token ids <-> SNAC codes (7 tokens per frame, 3 codebook levels).

Orpheus writes one SNAC 24 kHz frame as 7 tokens. The token at stream position p
carries code c of its level as id = offset + codebook_size * (p mod 7) + c
(offset 128266, codebook_size 4096). Within a frame, positions map to levels as
Orpheus's decoder (`redistribute_codes` / `convert_to_audio`) does:

  position  0    1    2    3    4    5    6
  level     0    1    2    2    1    2    2      (level 0: 1 code/frame, 1: 2, 2: 4)

so level 1 reads positions (1, 4) and level 2 reads (2, 3, 5, 6), each in time order.
"""
from __future__ import annotations

import torch

TOKENS_PER_FRAME = 7
# frame positions feeding each SNAC level, in time order within the frame
LEVEL_POSITIONS: tuple[tuple[int, ...], ...] = ((0,), (1, 4), (2, 3, 5, 6))


def tokens_to_codes(tokens: torch.Tensor, offset: int, codebook_size: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Map frame-aligned token windows to SNAC's code levels.

    tokens: (B, 7F) int64 ids whose first token is frame position 0.
    Returns ([level0 (B, F), level1 (B, 2F), level2 (B, 4F)], valid (B,) bool). A row is
    invalid when any token is not an audio token of its position (Orpheus then drops the
    window); its codes are clamped to 0 so the batch still decodes with static shapes.
    """
    b, t = tokens.shape
    if t % TOKENS_PER_FRAME:
        raise ValueError(f"{t} tokens is not a whole number of {TOKENS_PER_FRAME}-token frames")
    frames = tokens.view(b, t // TOKENS_PER_FRAME, TOKENS_PER_FRAME)  # (B, F, 7)
    position = torch.arange(TOKENS_PER_FRAME, device=tokens.device)
    codes = frames - offset - codebook_size * position                # (B, F, 7)
    is_code = (codes >= 0) & (codes < codebook_size)
    valid = is_code.flatten(1).all(dim=1)
    codes = torch.where(is_code, codes, torch.zeros_like(codes))
    levels = [codes[:, :, list(p)].flatten(1) for p in LEVEL_POSITIONS]  # (B, F * len(p))
    return levels, valid


def codes_to_tokens(levels: list[torch.Tensor], offset: int, codebook_size: int) -> torch.Tensor:
    """Inverse of `tokens_to_codes`: levels (B, F), (B, 2F), (B, 4F) -> ids (B, 7F)."""
    b, f = levels[0].shape
    frames = torch.empty(b, f, TOKENS_PER_FRAME, dtype=torch.long, device=levels[0].device)  # (B, F, 7)
    for level, positions in zip(levels, LEVEL_POSITIONS):
        frames[:, :, list(positions)] = level.view(b, f, len(positions))
    position = torch.arange(TOKENS_PER_FRAME, device=frames.device)
    return (frames + offset + codebook_size * position).flatten(1)
