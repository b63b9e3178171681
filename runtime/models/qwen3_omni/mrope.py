"""The thinker's 3-D M-RoPE positions (temporal, height, width) per row, as transformers'
`Qwen3OmniMoeThinkerForConditionalGeneration.get_rope_index` assigns them (no audio in video):

  * text and audio rows: one position each, all three equal, counting up;
  * the placeholders of one image or video (a run of `<|image_pad|>` / `<|video_pad|>`
    ids, the merged tokens in row-major order per temporal patch): t = start + k·time_step
    for temporal patch k, h = start + row, w = start + column, where `start` is the position
    the next text row would have had;
  * the row after a picture continues at one past the largest of its positions;
  * a pad id after the prompt's last picture (a generated token) is text, as transformers'
    decode steps count on from the prompt.

The grids (t, h, w, time_step) come with the request (param `mrope_grids`, written by the
chat processor, runtime/models/qwen3_omni/vision_inputs.py) in prompt order; a Run that
starts at cache position 0 (a prompt, or a whole history recomputed after preemption)
starts the count again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.models.qwen3_omni.vision_inputs import VisualGrid, parse_grids


@dataclass
class _Track:
    grids: list[VisualGrid]
    next_grid: int = 0
    next_position: int = 0
    num_rows: int = 0


class MropePositions:
    """Positions of every request's thinker rows (module docstring)."""

    def __init__(self, pad_ids: tuple[int, int], merge: int) -> None:
        self.pad_ids, self.merge = frozenset(pad_ids), merge
        self._tracks: dict[int, _Track] = {}

    def open(self, request_id: int, grids: str) -> None:
        self._tracks[request_id] = _Track(parse_grids(grids))

    def close(self, request_id: int) -> None:
        self._tracks.pop(request_id, None)

    def positions(self, request_id: int, tokens: list[int], start: int) -> torch.Tensor:
        """(3, n) positions of `tokens`, the first at cache position `start`."""
        track = self._tracks.setdefault(request_id, _Track([]))
        if start == 0:
            track.next_grid = track.next_position = track.num_rows = 0
        elif start != track.num_rows:
            raise ValueError(f"request {request_id}: thinker rows start at {start} but {track.num_rows} have positions")
        pieces, i = [], 0
        while i < len(tokens):
            j = i + 1
            # once every picture of the prompt has its grid, a pad id is a generated token: text
            is_pad = tokens[i] in self.pad_ids and track.next_grid < len(track.grids)
            while j < len(tokens) and (tokens[j] == tokens[i] if is_pad else tokens[j] not in self.pad_ids):
                j += 1
            pieces.append(self._picture(request_id, track, j - i) if is_pad else self._text(track, j - i))
            i = j
        track.num_rows += len(tokens)
        return torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)

    def _text(self, track: _Track, n: int) -> torch.Tensor:
        rows = torch.arange(track.next_position, track.next_position + n).expand(3, -1)
        track.next_position += n
        return rows

    def _picture(self, request_id: int, track: _Track, n: int) -> torch.Tensor:
        g = track.grids[track.next_grid]
        h, w = g.h // self.merge, g.w // self.merge
        if g.t * h * w != n:
            raise ValueError(f"request {request_id}: a picture of {n} placeholders but grid {g} has {g.t * h * w}")
        t_index = torch.arange(g.t).view(-1, 1, 1).expand(-1, h, w) * g.time_step
        h_index = torch.arange(h).view(1, -1, 1).expand(g.t, -1, w)
        w_index = torch.arange(w).view(1, 1, -1).expand(g.t, h, -1)
        rows = torch.stack([t_index.flatten(), h_index.flatten(), w_index.flatten()]) + track.next_position
        track.next_grid += 1
        track.next_position = int(rows.max()) + 1
        return rows
