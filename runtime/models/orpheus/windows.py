"""Which frames of a streamed Orpheus token window the SNAC decoder emits.

The edge `lm.token -> snac.codes` uses the sliding policy (window 28 = 4 frames,
stride 7 = 1 frame; `runtime.streams.chunk_policy.Sliding`). Each chunk is the last
window of tokens, `start` is the stream index of its first token and `num_context` how
many of them earlier chunks already delivered. Orpheus decodes each 4-frame window and
keeps samples [2048:4096], the window's second frame: one frame of left context, two of
right context, so audio lags the newest token by two frames.

`emitted_frames` states that rule in stream frame indices, without per-request state:
after a non-final chunk ending at token e, frames below e // 7 - 2 have been emitted.
So a chunk whose new tokens start at p emits [frontier(p), frontier(end)), where
frontier(0) = 0, and the final chunk runs to the last complete frame.

Edges (argument `keep_edges`):
  * True (default): the first window also emits frame 0 and the final chunk the two
    lagged tail frames, so the stream's audio covers every complete frame exactly once
    (the concatenation has the length of a one-shot decode of the whole utterance);
  * False: Orpheus's behaviour exactly: frame 0 and the tail are never emitted, and an
    utterance shorter than one window (28 tokens) produces no audio.
Tokens of an incomplete trailing frame (e.g. an end-of-speech token) are ignored.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.models.orpheus.codes import TOKENS_PER_FRAME

LAG_FRAMES = 2  # frames of right context Orpheus waits for (window 4 frames, keep the 2nd)


@dataclass(frozen=True)
class FrameSpan:
    """The decode work of one chunk, in stream frame indices."""

    first: int   # first complete frame inside the chunk (the window starts here)
    end: int     # one past the last complete frame inside the chunk
    lo: int      # first frame to emit
    hi: int      # one past the last frame to emit (lo == hi: nothing to emit)

    @property
    def num_frames(self) -> int:
        return self.end - self.first


def _frontier(num_tokens: int) -> int:
    """Frames emitted once a non-final chunk ending at `num_tokens` has been decoded."""
    return max(0, num_tokens // TOKENS_PER_FRAME - LAG_FRAMES) if num_tokens else 0


def emitted_frames(start: int, num_items: int, num_context: int, is_final: bool, keep_edges: bool) -> FrameSpan:
    """The frames a chunk of `num_items` tokens starting at stream index `start` emits."""
    end_token = start + num_items
    first = -(-start // TOKENS_PER_FRAME)          # ceil: skip a leading partial frame
    end = max(first, end_token // TOKENS_PER_FRAME)
    new_from = start + num_context
    lo = _frontier(new_from)
    if new_from == 0 and not keep_edges:
        lo = 1
    hi = end if is_final and keep_edges else _frontier(end_token)
    lo, hi = max(lo, first), min(hi, end)
    return FrameSpan(first=first, end=end, lo=lo, hi=max(lo, hi))
