"""qwen3_omni_talker against transformers' Qwen3OmniMoeTalkerForConditionalGeneration (same weights)."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.models.qwen3_omni.omni_reference import (checkpoint_tensors, close_to_largest, hf_model, preset,
                                                            randomize, talker_config)
from runtime.model_executor.components import component_class
from runtime.model_executor.kv import KVBlockManager

KIND = "qwen3_omni_talker"


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    dims = preset(KIND)
    config = talker_config(dims, preset("qwen3_omni_code_predictor"))
    reference = hf_model.Qwen3OmniMoeTalkerForConditionalGeneration(config).eval()
    randomize(reference, seed=3)
    ours = component_class(KIND)(dims, {}).eval()
    tensors = checkpoint_tensors(reference)
    ours.load_hf_state_dict({k: v for k, v in tensors.items() if not k.startswith("code_predictor.")})
    return reference, ours


def _run(ours, rows: list[torch.Tensor], positions: list[torch.Tensor], steps: list[int]) -> list[torch.Tensor]:
    """Feed each request's rows in chunks of `steps` tokens through the paged cache; logits of every row."""
    manager, cache = KVBlockManager(16, 8), ours.make_kv_cache(16, 8)
    out = [[] for _ in rows]
    done = [0] * len(rows)
    for n in steps:
        schedule = []
        for i in range(len(rows)):
            (manager.append if i in manager else manager.allocate)(i, n)
            schedule.append((i, n))
        batch = manager.metadata(schedule)
        x = torch.cat([r[d: d + n] for r, d in zip(rows, done)])
        pos = torch.cat([p[..., d: d + n] for p, d in zip(positions, done)], dim=-1)
        logits = ours.compute_logits(ours(x, pos, batch, cache))
        for i, chunk in enumerate(logits.split(n)):
            out[i].append(chunk)
        done = [d + n for d in done]
    return [torch.cat(o) for o in out]


@torch.no_grad()
def test_forward_logits_match_transformers_with_prefill_then_decode(pair):
    reference, ours = pair
    h = preset(KIND)["hidden_size"]
    embeds = torch.randn(2, 9, h, generator=torch.Generator().manual_seed(4))
    expected = reference(inputs_embeds=embeds, use_cache=False).logits  # (2, 9, V)
    positions = torch.arange(9)
    got = _run(ours, list(embeds), [positions, positions], steps=[6, 1, 1, 1])
    for b in range(2):
        assert close_to_largest(got[b], expected[b])


@torch.no_grad()
def test_three_dimensional_positions_match_transformers(pair):
    """M-RoPE with distinct temporal/height/width positions (multimodal prompts)."""
    reference, ours = pair
    h = preset(KIND)["hidden_size"]
    embeds = torch.randn(1, 7, h, generator=torch.Generator().manual_seed(5))
    positions = torch.tensor([[0, 1, 2, 2, 2, 2, 5], [0, 1, 2, 2, 3, 3, 5], [0, 1, 2, 3, 2, 3, 5]])
    expected = reference(inputs_embeds=embeds, position_ids=positions[:, None], use_cache=False).logits[0]
    got = _run(ours, [embeds[0]], [positions], steps=[7])[0]
    assert close_to_largest(got, expected)
    flat = _run(ours, [embeds[0]], [torch.arange(7)], steps=[7])[0]
    # the height/width lanes move the logits by 6.3% of the largest (measured), 60x this bound and far above rounding
    assert not close_to_largest(flat, expected, rtol=1e-3)


@torch.no_grad()
def test_projections_and_codec_embedding_match_transformers(pair):
    reference, ours = pair
    d = preset(KIND)
    x = torch.randn(5, d["thinker_hidden_size"], generator=torch.Generator().manual_seed(6))
    assert close_to_largest(ours.project_text(x), reference.text_projection(x))
    assert close_to_largest(ours.project_hidden(x), reference.hidden_projection(x))
    assert not close_to_largest(ours.project_text(x), ours.project_hidden(x))
    codes = torch.tensor([0, 3, d["codec_bos_id"]])
    assert torch.equal(ours.embed_codes(codes), reference.get_input_embeddings()(codes))


def test_speakable_ids_are_the_codebook_and_eos():
    d = preset(KIND)
    talker = component_class(KIND)(d, {})
    allowed = talker.speakable()
    assert allowed[: d["codebook_size"]].all()
    assert allowed.sum() == d["codebook_size"] + 1 and allowed[d["codec_eos_token_id"]]
    assert not allowed[d["codec_bos_id"]] and not allowed[d["codec_pad_id"]]
