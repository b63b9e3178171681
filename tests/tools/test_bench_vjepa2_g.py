"""The vjepa2-g suite's parts that run without its 10 GB of weights: both sides see the same context pixels (the
suite's own normalisation against the one mstar's /v1/rollouts applies to the PNG it is sent), and the
agreement measure."""
from __future__ import annotations

import torch

from bench.suite_vjepa2_g import IMAGE, _agreement, _inputs
from runtime.models.vjepa2.rollouts_api import _png_frame


def test_meta_gets_the_pixels_mstar_decodes_from_the_png() -> None:
    png, clip, states, actions = _inputs(4)
    assert clip.shape == (1, 3, 2, IMAGE, IMAGE) and torch.equal(clip[:, :, 0], clip[:, :, 1])
    served = _png_frame(png, IMAGE, "frames[0]")
    # the same float32 formula on the same bytes on both sides; 1e-6 covers a fused multiply-add's last bit
    torch.testing.assert_close(clip[0, :, 0], served, rtol=0.0, atol=1e-6)
    assert states.shape == (1, 1, 7) and actions.shape == (1, 4, 7)


def test_agreement_is_the_cosine_of_each_predicted_frame() -> None:
    g = torch.Generator().manual_seed(0)
    mstar = torch.randn(3, 4, 8, generator=g)
    native = mstar[None].clone()
    native[0, 1] = -native[0, 1]                  # frame 1 points the other way
    native[0, 2] *= 5.0                           # frame 2 only longer: the same direction
    cos = _agreement(mstar, native)
    # a cosine of equal or opposite vectors: 1 and -1 up to the rounding of an 8-term fp32 dot product
    assert len(cos) == 3 and abs(cos[0] - 1) < 1e-6 and abs(cos[1] + 1) < 1e-6 and abs(cos[2] - 1) < 1e-6
