"""qwen3_omni_vision_encoder against transformers' Qwen3OmniMoeVisionEncoder (same weights)."""
from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from tests.runtime.models.qwen3_omni.omni_reference import (checkpoint_tensors, close_to_largest, hf_model, preset,
                                                            randomize, vision_config)
from runtime.model_executor.components import component_class
from runtime.models.qwen3_omni.vision_grid import patchify

KIND = "qwen3_omni_vision_encoder"


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    dims = preset(KIND)
    reference = hf_model.Qwen3OmniMoeVisionEncoder(vision_config(dims)).eval()
    randomize(reference, seed=17)
    ours = component_class(KIND)(dims, {}).eval()
    ours.load_hf_state_dict(checkpoint_tensors(reference))
    return reference, ours


def _image(height: int, width: int, seed: int) -> torch.Tensor:
    return torch.rand(3, height, width, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_patchify_matches_the_qwen2_vl_image_processor():
    d = preset(KIND)
    image = _image(32, 48, seed=1)
    expected, grid_h, grid_w = Qwen2VLImageProcessorPil().patchify(
        image.numpy(), d["patch_size"], d["spatial_merge_size"], d["temporal_patch_size"])
    got, grid = patchify(image, d["patch_size"], d["spatial_merge_size"], d["temporal_patch_size"])
    assert grid == (1, grid_h, grid_w) == (1, 4, 6)
    assert torch.equal(got, torch.from_numpy(expected.copy()))


@torch.no_grad()
def test_hidden_and_deepstack_match_transformers(pair):
    """Two images of different shapes packed in one call, plus a two-frame (video) grid."""
    reference, ours = pair
    d = preset(KIND)
    pieces = [patchify(_image(h, w, seed), d["patch_size"], d["spatial_merge_size"], d["temporal_patch_size"])
              for h, w, seed in ((32, 48, 2), (64, 32, 3))]
    video = torch.randn(2 * 16, pieces[0][0].shape[1], generator=torch.Generator().manual_seed(4))
    patches = torch.cat([p for p, _ in pieces] + [video])
    grids = torch.tensor([g for _, g in pieces] + [(2, 4, 4)])
    expected = reference(hidden_states=patches, grid_thw=grids)
    hidden, deepstack = ours.encode_patches(patches, grids)
    assert hidden.shape == expected.pooler_output.shape == (6 + 8 + 8, d["out_hidden_size"])
    assert close_to_largest(hidden, expected.pooler_output)
    assert deepstack.shape[0] == len(expected.deepstack_features) == len(d["deepstack_visual_indexes"])
    for got, want in zip(deepstack, expected.deepstack_features):
        assert close_to_largest(got, want)


@torch.no_grad()
def test_batch_equals_members_one_at_a_time(pair):
    _, ours = pair
    images = [_image(32, 48, 5), _image(64, 64, 6), _image(30, 17, 7)]  # the last one is resized to 32 x 16
    together = ours(images)
    assert [h.shape[0] for h, _ in together] == [6, 16, 2]
    for image, (hidden, deepstack) in zip(images, together):
        alone_hidden, alone_deepstack = ours([image])[0]
        # images packed into one call against one: other row counts (GEMM blockings), fp32 order differences only;
        # measured at most 2.2e-7 of the largest value
        assert close_to_largest(hidden, alone_hidden, rtol=1e-5)
        assert close_to_largest(deepstack, alone_deepstack, rtol=1e-5)     # the same: measured 2.2e-7
