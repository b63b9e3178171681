"""`bagel_mot_lm` against transformers (understanding path) and a dense BAGEL (MoT path);
batches equal their members; weights load by BAGEL's checkpoint names."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from tests.runtime.models.bagel.bagel_lm_helpers import DIMS, RefSequence, Runner, bagel_weights, build_lm
from bench.bagel_upstream_lm import DenseBagel
from runtime.models.bagel.segments import SegmentKind as K
from runtime.model_executor.components import component_class
from runtime.model_executor.weights import WeightLoadError

IDS = [7, 42, 99, 3, 250]


@pytest.fixture(scope="module")
def weights():
    return bagel_weights(DIMS, seed=3)


def test_understanding_path_matches_transformers(weights):
    """With zero q/k/v biases the understanding expert is a Qwen3 decoder (q/k RMSNorm)."""
    w = {k: torch.zeros_like(v) if k.endswith("_proj.bias") else v for k, v in weights.items()}
    model = build_lm(w)
    config = Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, rope_theta=DIMS["rope_theta"],
        rms_norm_eps=DIMS["rms_norm_eps"], tie_word_embeddings=False, attention_bias=False)
    hf = Qwen3ForCausalLM(config).eval()
    hf_state = {k.removeprefix("language_model."): v for k, v in w.items()
                if k.startswith("language_model.") and "moe_gen" not in k and not k.endswith("bias")}
    hf.load_state_dict(hf_state)
    runner = Runner(model)
    runner.one("a", K.TEXT, tokens=torch.tensor(IDS))
    logits = runner.one("a", K.DECODE, tokens=torch.tensor([11]))
    sequence = [DIMS["bos_token_id"], *IDS, DIMS["eos_token_id"], 11]
    with torch.no_grad():
        want = hf(torch.tensor([sequence])).logits[0, -1]
    # fp32, transformers' Qwen3 against the MoT LM's understanding path on the same weights: other op orders (fused
    # projections, paged attention), a few ulps (eps 1.2e-7) per layer on logits |l| <= 1.3; measured max 4.2e-7
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)


def test_every_segment_kind_matches_dense_bagel(weights):
    """I2I-like context (VIT, VAE, TEXT), a velocity (GEN), then text decoding (DECODE)."""
    torch.manual_seed(0)
    runner, ref = Runner(build_lm(weights), block_size=4), RefSequence(DenseBagel(weights, DIMS))
    vit = torch.randn(6, 64) * 0.5
    clean, noisy = torch.randn(16, 4, 6), torch.randn(16, 4, 6)
    for kind, kw, ref_step in [(K.VIT, {"embeds": vit}, lambda: ref.vit(vit)),
                               (K.VAE, {"latent": clean}, lambda: ref.vae(clean)),
                               (K.TEXT, {"tokens": torch.tensor(IDS)}, lambda: ref.text(IDS))]:
        assert runner.one("a", kind, **kw) is None
        ref_step()
        assert runner.rope["a"] == ref.rope
    velocity = runner.one("a", K.GEN, latent=noisy, timestep=0.7)
    # the dense restatement against the paged path, fp32: order differences only; measured max 2.4e-7 at |v| <= 1.8
    torch.testing.assert_close(velocity, ref.gen(noisy, 0.7), rtol=1e-4, atol=1e-5)
    assert velocity.abs().max() > 1e-3
    for token in (DIMS["bos_token_id"], 17):
        # as above, on logits |l| <= 1.4: measured max 3.7e-7
        torch.testing.assert_close(runner.one("a", K.DECODE, tokens=torch.tensor([token])),
                                   ref.decode(token), rtol=1e-4, atol=1e-4)


def test_batch_equals_members(weights):
    """One call of mixed kinds (and two CFG-like branches) == each segment alone."""
    torch.manual_seed(1)
    model = build_lm(weights)
    vit, latent = torch.randn(4, 64), torch.randn(16, 4, 4)
    steps = [("p", K.TEXT, {"tokens": torch.tensor(IDS)}), ("q", K.TEXT, {"tokens": torch.tensor([5, 6])}),
             ("r", K.VIT, {"embeds": vit})]
    batched, alone = Runner(model), Runner(model)
    batched.run([(s, batched.segment(s, k, **kw)) for s, k, kw in steps])
    for s, k, kw in steps:
        alone.one(s, k, **kw)
    calls = [("p", K.GEN, {"latent": latent, "timestep": 0.9}), ("q", K.GEN, {"latent": latent, "timestep": 0.9}),
             ("r", K.DECODE, {"tokens": torch.tensor([9])}), ("s", K.TEXT, {"tokens": torch.tensor([1, 2, 3])}),
             ("p", K.DECODE, {"tokens": torch.tensor([4])})]
    got = batched.run([(s, batched.segment(s, k, **kw)) for s, k, kw in calls[:4]])
    got += batched.run([(s, batched.segment(s, k, **kw)) for s, k, kw in calls[4:]])
    want = [alone.one(s, k, **kw) for s, k, kw in calls]
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            # one mixed call against each segment alone: other row counts, so other GEMM blockings, fp32 order
            # differences of a few ulps (eps 1.2e-7) at |x| <= 1.5; measured max 4.2e-7, 3% of the bound
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert batched.rope == alone.rope


def test_weights_load_from_a_bagel_checkpoint(weights, tmp_path):
    """This component's tensors by their BAGEL names load; another component's are refused (which
    of the combined ema.safetensors are whose is the graph's mapping, not the component's)."""
    path = tmp_path / "ema.safetensors"
    save_file({**weights, "vit_model.vision_model.post_layernorm.weight": torch.ones(4)}, str(path))
    with pytest.raises(WeightLoadError, match=r"unexpected \(1\): vit_model\.vision_model\.post_layernorm"):
        component_class("bagel_mot_lm")(DIMS, {"weights": str(path)})
    save_file(weights, str(path))
    model = component_class("bagel_mot_lm")(DIMS, {"weights": str(path)})
    gen_q = weights["language_model.model.layers.1.self_attn.q_proj_moe_gen.weight"]
    fused = model.language_model.model.layers[1].self_attn_moe_gen.qkv_proj.weight
    # fp32 tensors copied from the file into place (the q rows of the fused qkv): bit-equal
    torch.testing.assert_close(fused[: gen_q.shape[0]], gen_q, rtol=0, atol=0)
    torch.testing.assert_close(model.vae2llm.weight, weights["vae2llm.weight"], rtol=0, atol=0)
    assert "language_model.model.norm_moe_gen.weight" in model.hf_slots()
