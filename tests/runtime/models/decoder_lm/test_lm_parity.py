"""Same weights, same logits: our paged decoders against transformers' reference models.

Prefill of a prompt spanning several cache blocks, then 32 decode steps through the paged
cache, fp32, logits within 1e-4 at every step.
"""
from __future__ import annotations

import pytest
import torch

from tests.runtime.models.decoder_lm.lm_factories import CASES, PagedRunner, build, checkpoint_state_dict, hf_twin, tiny_dims

PROMPT_LEN = 11
DECODE_STEPS = 32
# fp32, transformers' eager ops against our paged path (fused QKV / gate-up GEMMs, other attention kernels): order
# differences in 2 layers of 64- to 128-term sums and a softmax over up to 43 keys, a few ulps (eps 1.2e-7) each,
# on logits |l| <= 2; measured max 9.4e-7 over every case and step, 1% of the bound
ATOL = 1e-4


@pytest.mark.parametrize("case", sorted(CASES))
def test_prefill_and_decode_match_transformers(case: str) -> None:
    kind, overrides = CASES[case]
    dims = tiny_dims(kind, **overrides)
    hf = hf_twin(kind, dims)
    ours = build(kind, dims)
    ours.load_hf_state_dict(checkpoint_state_dict(hf))
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, dims["vocab_size"], (PROMPT_LEN + DECODE_STEPS,), generator=gen)
    runner = PagedRunner(ours, num_blocks=32, block_size=4)

    with torch.no_grad():
        out = hf(input_ids=tokens[None, :PROMPT_LEN], use_cache=True)
        (ours_prefill,) = runner.step([("r", tokens[:PROMPT_LEN].tolist())])
        torch.testing.assert_close(ours_prefill, out.logits[0], atol=ATOL, rtol=0)
        cache = out.cache
        for t in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
            out = hf(input_ids=tokens[None, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            (ours_step,) = runner.step([("r", [int(tokens[t])])])
            torch.testing.assert_close(ours_step, out.logits[0], atol=ATOL, rtol=0, msg=f"decode position {t}")


def test_multimodal_rope_matches_qwen3_omni_thinker() -> None:
    """(3, N) positions with an mrope_section rotate like transformers' Qwen3-Omni thinker; (N,) is plain RoPE."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTextConfig

    from runtime.model_executor.layers.rotary import RotaryEmbedding

    scaling = {"rope_type": "default", "mrope_section": [4, 2, 2]}
    config = Qwen3OmniMoeTextConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                                    rope_parameters={**scaling, "rope_theta": 1e6})
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 300, (3, 9), generator=gen)
    q, k = torch.randn(9, 4, 16, generator=gen), torch.randn(9, 2, 16, generator=gen)
    cos, sin = omni.Qwen3OmniMoeThinkerTextRotaryEmbedding(config)(q, positions[:, None, :])
    expected_q, expected_k = omni.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    rope = RotaryEmbedding(16, 1e6, scaling)
    got_q, got_k = rope(positions, q, k)
    # fp32 both sides: cos/sin of the same angles, then two products and a sum per lane, in other op orders: a few
    # ulps (eps 1.2e-7) at |q| <= 4.1; measured max 2.4e-7, 0.8% of the bound
    torch.testing.assert_close(got_q, expected_q[0].transpose(0, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, expected_k[0].transpose(0, 1), atol=1e-5, rtol=1e-5)  # as q: measured 1.2e-7
    text_q, _ = rope(positions[0].expand(3, -1), q, k)
    # the same angles through the sectioned path and the plain one: measured exact; torch's fp32 defaults (rtol
    # 1.3e-6, atol 1e-5) leave an ulp where a path vectorises otherwise
    torch.testing.assert_close(text_q, rope(positions[0], q, k)[0])
    # spatial positions move q by up to 3.9 (measured): no rounding brings that inside allclose's default 1e-5
    assert not torch.allclose(got_q, rope(positions[0], q, k)[0]), "spatial positions must matter"


def test_embeds_rows_match_transformers_inputs_embeds() -> None:
    """Encoder outputs fed through `embeds`/`embeds_rows` act as transformers' `inputs_embeds` rows."""
    kind = "qwen2_lm"
    dims = tiny_dims(kind)
    hf = hf_twin(kind, dims)
    ours = build(kind, dims)
    ours.load_hf_state_dict(checkpoint_state_dict(hf))
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, dims["vocab_size"], (10,), generator=gen)
    rows = torch.tensor([2, 3, 4, 7])
    embeds = torch.randn(len(rows), dims["hidden_size"], generator=gen) * 0.05
    with torch.no_grad():
        full = hf.get_input_embeddings()(tokens).index_copy(0, rows, embeds)
        expected = hf(inputs_embeds=full[None]).logits[0]
        runner = PagedRunner(ours)
        runner.manager.allocate("r", 10)
        batch = runner.manager.metadata([("r", 10)])
        hidden = ours(tokens, torch.arange(10), batch, runner.cache, embeds=embeds, embeds_rows=rows)
        torch.testing.assert_close(ours.compute_logits(hidden), expected, atol=ATOL, rtol=0)
