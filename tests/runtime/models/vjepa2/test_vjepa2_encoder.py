"""vjepa2_encoder against transformers' VJEPA2Model encoder with the same weights."""
from __future__ import annotations

import torch

from tests.runtime.models.vjepa2.vjepa2_reference import hf_encoder, make, tiny

# fp32, transformers' VJEPA2 encoder against ours on the same weights: the same layers in other op orders (fused
# projections, SDPA against eager attention), a few ulps (eps 1.2e-7) per layer of features |x| <= 3.6; measured
# max 4.8e-7, 0.5% of the bound
RTOL, ATOL = 1e-4, 1e-5


def _pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    ours = make("vjepa2_encoder")
    torch.manual_seed(1)
    ref = hf_encoder(tiny("vjepa2_encoder"))
    weights = {k: v for k, v in ref.state_dict().items() if k.startswith("encoder.")}
    ours.load_state_dict(weights, strict=True)  # same names as the HF checkpoint's encoder.*
    return ours, ref


def test_matches_transformers_encoder():
    ours, ref = _pair()
    video = torch.randn(2, 4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = ours(video)
        want = ref.get_vision_features(video)
    assert got.shape == (2, 2 * 4 * 4, 48)  # 2 tubelets x 4 x 4 patches
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_single_image_is_repeated_into_a_tubelet():
    ours, ref = _pair()
    image = torch.randn(1, 1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = ours(image)
        torch.testing.assert_close(got, ref.get_vision_features(image), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(got, ours(image.repeat(1, 2, 1, 1, 1)), rtol=0, atol=0)


def test_batch_invariance_and_normalize_reps():
    ours, _ = _pair()
    video = torch.randn(3, 2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        batched = ours(video)
        alone = torch.cat([ours(video[i:i + 1]) for i in range(3)])
        ours.normalize_reps = True
        normed = ours(video)
    # a batch of 3 against 1: a BLAS may block the rows otherwise, a few fp32 ulps (eps 1.2e-7) of |x| <= 3.2;
    # measured exact here (both lines)
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(normed, torch.nn.functional.layer_norm(batched, (48,)), rtol=1e-5, atol=1e-6)  # ulps
