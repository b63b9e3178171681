"""The thinker's M-RoPE position tracker on its own: pictures on grids, generated pad ids as text,
a recompute from cache position 0 gives the same positions (transformers' parity is in
test_image_chat_parity.py)."""
from __future__ import annotations

import pytest
import torch

from runtime.models.qwen3_omni.mrope import MropePositions

IMAGE, VIDEO = 504, 505


def test_pictures_text_and_generated_pads():
    tracker = MropePositions((IMAGE, VIDEO), merge=2)
    tracker.open(1, "1,4,4,0;2,2,4,13")                        # an image of 2x2 tokens, a video of 2x1x2
    prompt = [7, 8, *[IMAGE] * 4, 9, *[VIDEO] * 4, 10]
    got = tracker.positions(1, prompt, 0)
    assert got.tolist() == [[0, 1, 2, 2, 2, 2, 4, 5, 5, 18, 18, 19],
                            [0, 1, 2, 2, 3, 3, 4, 5, 5, 5, 5, 19],
                            [0, 1, 2, 3, 2, 3, 4, 5, 6, 5, 6, 19]]
    decoded = tracker.positions(1, [IMAGE], len(prompt))      # a generated pad id: the next text position
    assert decoded.tolist() == [[20], [20], [20]]
    again = tracker.positions(1, prompt + [IMAGE], 0)         # a recompute after preemption
    assert torch.equal(again, torch.cat((got, decoded), dim=1))


def test_rows_out_of_step_are_an_error():
    tracker = MropePositions((IMAGE, VIDEO), merge=2)
    tracker.open(1, "")
    tracker.positions(1, [1, 2, 3], 0)
    with pytest.raises(ValueError, match="start at 5 but 3 have positions"):
        tracker.positions(1, [4], 5)
