"""The decoder_lm catalogue entries: full-size parameter counts equal transformers' models of the same dims.

Full-size models are built on the meta device (no memory, no weights), so the counts the
compiler plans memory with are checked against the reference architecture at every size.
"""
from __future__ import annotations

import pytest
import torch

from tests.runtime.models.decoder_lm.lm_factories import hf_config
from mstar_compiler.catalogue import load_catalogue
from mstar_compiler.catalogue.decoder_lm import KINDS

FULL = [(spec.kind, name) for spec in KINDS for name in spec.presets if name != "tiny"]


@pytest.mark.parametrize("kind, preset", FULL, ids=[f"{k}:{p}" for k, p in FULL])
def test_num_params_equals_transformers(kind: str, preset: str) -> None:
    import transformers

    classes = {"llama_lm": transformers.LlamaForCausalLM, "qwen2_lm": transformers.Qwen2ForCausalLM,
               "qwen3_lm": transformers.Qwen3ForCausalLM, "qwen3_moe_lm": transformers.Qwen3MoeForCausalLM}
    spec = load_catalogue()[kind]
    dims = spec.presets[preset]
    with torch.device("meta"):
        model = classes[kind](hf_config(kind, dims))
    assert spec.num_params(dims) == sum(p.numel() for p in model.parameters())


def test_published_sizes_and_kv_bytes() -> None:
    cat = load_catalogue()
    smollm2 = cat["llama_lm"].presets["smollm2-135m"]
    assert cat["llama_lm"].num_params(smollm2) == 134_515_008
    # 30 layers x K,V x 3 kv heads x 64 dims x 2 bytes
    assert cat["llama_lm"].kv_bytes_per_token(smollm2, 2) == 30 * 2 * 3 * 64 * 2
    assert 30.4e9 < cat["qwen3_moe_lm"].num_params(cat["qwen3_moe_lm"].presets["qwen3-30b-a3b"]) < 30.6e9
    assert 7.6e9 < cat["qwen2_lm"].num_params(cat["qwen2_lm"].presets["qwen2.5-7b"]) < 7.7e9
    for spec in KINDS:
        assert spec.has_kv_cache and spec.can_batch
        assert spec.is_capture_safe == (spec.kind != "qwen3_moe_lm")   # MoE routing reads counts to the host
        # the Qwen3-Omni thinker's kind also takes DeepStack rows (optional, like embeds)
        extra = ["deepstack"] if spec.kind == "qwen3_moe_lm" else []
        assert [p.name for p in spec.inputs] == ["tokens", "embeds", *extra] and all(p.optional for p in spec.inputs[1:])
        assert [p.name for p in spec.outputs] == ["token", "hidden"] and all(p.stream for p in spec.outputs)
