"""`siglip_vit`: the tower equals transformers' SiglipVisionModel on the same weights;
the connector and position table follow BAGEL; batches equal their members one at a time."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from transformers import SiglipVisionConfig
from transformers import SiglipVisionModel as HFSiglipVisionModel

from mstar_compiler.catalogue import load_catalogue
from runtime.models.bagel.embeddings import sincos_2d_table
from runtime.model_executor.components import component_class
from runtime.models.bagel.siglip_vit import conv_patch_weight_to_linear
from runtime.model_executor.weights import WeightLoadError

SPEC = load_catalogue()["siglip_vit"]
DIMS = SPEC.presets["tiny"]


def _build(seed: int = 0, **args):
    return component_class("siglip_vit")(DIMS, {**SPEC.args, "seed": seed, **args}).eval()


def _hf_twin(model) -> HFSiglipVisionModel:
    side = DIMS["max_num_patch_per_side"]
    config = SiglipVisionConfig(
        hidden_size=DIMS["hidden_size"], intermediate_size=DIMS["intermediate_size"],
        num_hidden_layers=DIMS["num_hidden_layers"], num_attention_heads=DIMS["num_attention_heads"],
        image_size=side * DIMS["patch_size"], patch_size=DIMS["patch_size"],
        layer_norm_eps=DIMS["layer_norm_eps"], attn_implementation="eager")
    hf = HFSiglipVisionModel(config).eval()
    # transformers 5 names the tower's parameters without the checkpoint's "vision_model." prefix
    prefix = "vit_model.vision_model."
    ours = {k.removeprefix(prefix): v for k, v in model.state_dict().items() if k.startswith(prefix)}
    theirs = hf.state_dict()
    key = "embeddings.patch_embedding.weight"
    conv = torch.randn_like(theirs[key])
    ours[key] = conv  # an HF conv weight; ours takes its linear form
    model.vit_model.vision_model.embeddings.patch_embedding.weight.data.copy_(conv_patch_weight_to_linear(conv))
    missing = set(theirs) - set(ours)
    assert missing and all(k.startswith("head.") for k in missing), missing
    hf.load_state_dict({**theirs, **ours})
    return hf


def test_tower_matches_transformers():
    model = _build()
    hf = _hf_twin(model)
    image = torch.rand(3, 56, 56) * 2 - 1
    with torch.no_grad():
        want = hf(pixel_values=image[None]).last_hidden_state[0]
    got, _, seqlens = model.tower([image])
    assert seqlens == [16]
    # fp32, transformers' SigLIP against ours (the patch conv as a linear, varlen attention): other op orders through
    # the layers, a few ulps (eps 1.2e-7) each at |h| <= 2.5; measured max 1.8e-6, 5% of the bound
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_connector_and_position_table_follow_bagel():
    model = _build()
    image = torch.rand(3, 28, 42) * 2 - 1  # 2 x 3 patches on the 4 x 4 grid
    hidden, position_ids, _ = model.tower([image])
    assert position_ids.tolist() == [0, 1, 2, 4, 5, 6]
    c = model.connector
    want = c.fc2(torch.nn.functional.gelu(c.fc1(hidden), approximate="tanh"))
    want = want + sincos_2d_table(DIMS["llm_hidden_size"], 4)[position_ids]
    (got,) = model([image])
    assert got.shape == (6, DIMS["llm_hidden_size"])
    # the same connector ops on the same hidden rows: measured exact, inside torch's fp32 defaults (rtol 1.3e-6, atol
    # 1e-5) where a GEMM blocks 6 rows otherwise
    torch.testing.assert_close(got, want)


def test_batch_equals_members():
    model = _build(seed=1)
    images = [torch.rand(3, h, w) * 2 - 1 for h, w in [(56, 56), (28, 42), (42, 14)]]
    batch = model(images)
    for image, out in zip(images, batch):
        # three images packed into one call against one: other row counts (GEMM blockings), fp32 order differences of
        # a few ulps (eps 1.2e-7) at |h| <= 1.8; measured max 2.4e-7, 10% of the bound
        torch.testing.assert_close(out, model([image])[0], rtol=1e-5, atol=1e-6)


def test_weights_load_by_bagel_names(tmp_path):
    source = _build(seed=2)
    state = {k: v for k, v in source.state_dict().items() if k != "vit_pos_embed.pos_embed"}
    path = tmp_path / "ema.safetensors"
    save_file({**state, "language_model.model.norm.weight": torch.ones(64)}, str(path))
    with pytest.raises(WeightLoadError, match=r"unexpected \(1\): language_model\.model\.norm\.weight"):
        _build(weights=str(path))             # the LM's tensor: the graph's mapping keeps it from this node
    save_file(state, str(path))
    loaded = _build(seed=7, weights=str(path))
    image = torch.rand(3, 28, 28) * 2 - 1
    torch.testing.assert_close(loaded([image])[0], source([image])[0], rtol=0, atol=0)
    assert not torch.equal(_build(seed=7)([image])[0], source([image])[0])
    del state["connector.fc2.bias"]
    save_file(state, str(path))
    with pytest.raises(WeightLoadError, match="connector.fc2.bias"):
        _build(weights=str(path))
