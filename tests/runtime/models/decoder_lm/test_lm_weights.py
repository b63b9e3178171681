"""Loading HF-layout safetensors into the decoders: fusion on load, key-by-key errors, seeded random weights."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.runtime.models.decoder_lm.lm_factories import build, checkpoint_state_dict, hf_twin, tiny_dims
from runtime.model_executor.components import component_class
from runtime.model_executor.weights import WeightLoadError, iter_safetensors


def test_safetensors_directory_loads_and_fuses(tmp_path: Path) -> None:
    dims = tiny_dims("qwen2_lm")
    state = checkpoint_state_dict(hf_twin("qwen2_lm", dims))
    names = sorted(state)
    save_file({k: state[k].contiguous() for k in names[:10]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: state[k].contiguous() for k in names[10:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    model = component_class("qwen2_lm")(dims, {"weights": str(tmp_path)})
    qkv = model.model.layers[1].self_attn.qkv_proj
    prefix = "model.layers.1.self_attn."
    expected = torch.cat([state[f"{prefix}{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv.weight, expected)
    assert torch.equal(qkv.bias, torch.cat([state[f"{prefix}{p}_proj.bias"] for p in "qkv"]))
    assert dict(iter_safetensors(tmp_path)).keys() == state.keys()


def test_mismatched_checkpoint_lists_every_problem() -> None:
    dims = tiny_dims("llama_lm")
    state = checkpoint_state_dict(hf_twin("llama_lm", dims))
    del state["model.layers.0.mlp.up_proj.weight"]
    state["model.layers.0.mlp.extra.weight"] = torch.zeros(3)
    state["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    with pytest.raises(WeightLoadError) as info:
        build("llama_lm", dims).load_hf_state_dict(state)
    err = info.value
    assert err.missing == ["model.layers.0.mlp.up_proj.weight"]
    assert err.unexpected == ["model.layers.0.mlp.extra.weight"]
    assert len(err.misshaped) == 1 and "model.layers.1.self_attn.k_proj.weight (16, 64)" in err.misshaped[0]
    assert "missing (1)" in str(err) and "unexpected (1)" in str(err) and "wrong shape (1)" in str(err)


def test_random_weights_are_seeded_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    dims = tiny_dims("qwen3_moe_lm")
    # a debug line here: the loud warning is the loader's, which knows whether a checkpoint replaces them
    with caplog.at_level(logging.DEBUG):
        a, b, c = (build("qwen3_moe_lm", dims, seed=s) for s in (7, 7, 8))
    assert "random weights (seed=7)" in caplog.text
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        assert name.endswith("norm.weight") or not torch.equal(pa, pc), name


def test_tied_checkpoint_may_carry_lm_head() -> None:
    dims = tiny_dims("llama_lm", tie_word_embeddings=True)
    state = checkpoint_state_dict(hf_twin("llama_lm", dims))
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    model = build("llama_lm", dims)
    model.load_hf_state_dict(state)
    assert model.lm_head.table() is model.model.embed_tokens.weight
