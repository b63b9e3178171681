"""qwen3_omni_code_predictor against transformers' Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.models.qwen3_omni.omni_reference import checkpoint_tensors, hf_model, predictor_config, preset, randomize
from runtime.model_executor.components import component_class

KIND = "qwen3_omni_code_predictor"


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    dims = preset(KIND)
    reference = hf_model.Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration(predictor_config(dims)).eval()
    randomize(reference, seed=7)
    ours = component_class(KIND)(dims, {}).eval()
    ours.load_hf_state_dict(checkpoint_tensors(reference))
    return reference, ours


def _prefix(batch: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, 2, preset(KIND)["hidden_size"], generator=torch.Generator().manual_seed(seed))


def _recording_greedy(log: list[torch.Tensor]):
    def sample(logits: torch.Tensor) -> torch.Tensor:
        log.append(logits)
        return logits.argmax(dim=-1)
    return sample


@torch.no_grad()
def test_frames_and_logits_match_transformers_generate(pair):
    reference, ours = pair
    groups = preset(KIND)["num_code_groups"]
    prefix, code0 = _prefix(3, seed=8), torch.tensor([5, 0, 17])
    result = reference.generate(inputs_embeds=prefix, max_new_tokens=groups - 1, do_sample=False,
                                output_logits=True, return_dict_in_generate=True)
    logits: list[torch.Tensor] = []
    codes, frame_embed = ours.predict_frames(prefix, code0, sample=_recording_greedy(logits))
    assert codes.shape == (3, groups)
    assert torch.equal(codes[:, 0], code0)
    assert torch.equal(codes[:, 1:], result.sequences[:, -(groups - 1):])
    assert len(logits) == len(result.logits) == groups - 1
    for got, expected in zip(logits, result.logits):
        # fp32, transformers' generate against ours on the same weights: other op orders through the layers, a few
        # ulps (eps 1.2e-7) of the largest logit; measured at most 4.0e-7 of it (1e-4: ~800 eps)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    embeddings = reference.get_input_embeddings()
    expected_embed = prefix[:, 1] + sum(embeddings[g](codes[:, g + 1]) for g in range(groups - 1))
    # the prefix row plus the 3 codes' embeddings, summed in another order: a few fp32 ulps; measured 1.0e-7 of the
    # largest value
    assert (frame_embed - expected_embed).abs().max() <= 1e-5 * expected_embed.abs().max()


@torch.no_grad()
def test_batch_equals_members_one_at_a_time(pair):
    _, ours = pair
    prefix, code0 = _prefix(4, seed=9), torch.tensor([1, 2, 3, 4])
    codes, frame_embed = ours.predict_frames(prefix, code0)
    for i in range(4):
        alone_codes, alone_embed = ours.predict_frames(prefix[i: i + 1], code0[i: i + 1])
        assert torch.equal(alone_codes[0], codes[i])
        # a batch of 4 frames against one: other row counts through the GEMMs, fp32 order differences of a few ulps
        # (eps 1.2e-7) at |x| <= 2.6; measured exact here
        assert torch.allclose(alone_embed[0], frame_embed[i], rtol=1e-5, atol=1e-6)


def test_rejects_a_cache_too_small_for_a_frame(pair):
    _, ours = pair
    cache = ours.make_kv_cache(1, block_size=2)
    with pytest.raises(ValueError, match="cache blocks"):
        ours.predict_frames(_prefix(1, seed=1), torch.tensor([0]), kv_cache=cache)
