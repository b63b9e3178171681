"""SmolLM2-135M-Instruct from its GGUF, end to end, against transformers loading the same file.

transformers' GGUF loading takes ~11 s, so it happens once for the module. fp32 greedy
throughout: the first answer token is a near tie ("The" vs "L"), so bf16 or a reordered sum may flip it.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from mstar_compiler.catalogue.decoder_lm import LLAMA_PRESETS
from runtime.model_executor.sampling import SamplingParams
from runtime.text.gguf_tokenizer import tokenizer_from_gguf
from runtime.model_executor.weights.gguf_loader import SMOLLM2, open_gguf, resolve_gguf
from tests.runtime.models.decoder_lm.smollm2_factories import build_llama_lm, generate

NEW_TOKENS = 24
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def ckpt():
    return open_gguf(SMOLLM2)


@pytest.fixture(scope="module")
def hf_model():
    path = resolve_gguf(SMOLLM2)
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(ckpt):
    return tokenizer_from_gguf(ckpt)


@pytest.fixture(scope="module")
def model(ckpt):
    return build_llama_lm(ckpt)


def test_config_from_metadata_is_the_catalogue_preset(ckpt) -> None:
    config, preset = ckpt.config(), LLAMA_PRESETS["smollm2-135m"]
    assert config.keys() == preset.keys()
    for key, value in preset.items():
        # GGUF metadata holds floats as float32 (rope_theta, rms_norm_eps): rounded by 6e-8 relative at most
        assert config[key] == pytest.approx(value, rel=1e-6), key


def test_state_dict_equals_transformers_gguf_loading(ckpt, hf_model) -> None:
    ours = ckpt.state_dict()
    theirs = hf_model.state_dict()
    assert set(theirs) - set(ours) == {"lm_head.weight"}          # tied: the model shares the embedding
    assert set(ours) <= set(theirs)
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, theirs[name]), name
    assert torch.equal(theirs["lm_head.weight"], ours["model.embed_tokens.weight"])


def test_greedy_chat_answer_names_paris_and_matches_transformers(model, tokenizer, hf_model) -> None:
    prompts = [tokenizer.encode_chat(QUESTION), tokenizer.encode_chat(POEM)]
    greedy = SamplingParams(temperature=0)
    answer, poem = generate(model, tokenizer, prompts, [greedy, greedy], NEW_TOKENS)   # one batch of two
    assert "Paris" in answer.text
    assert answer.stop_reason == tokenizer.eos_token_id
    assert len(poem.token_ids) == NEW_TOKENS and poem.stop_reason is None
    assert poem.text == tokenizer.decode(poem.token_ids)
    for prompt, ours in zip(prompts, (answer, poem)):
        out = hf_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
        assert ours.token_ids == out[0, len(prompt):].tolist()


def test_seeded_sampling_is_reproducible_and_batch_invariant(model, tokenizer) -> None:
    prompt = tokenizer.encode_chat(POEM)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=7)
    (alone,) = generate(model, tokenizer, [prompt], [seeded], 8)
    other = tokenizer.encode_chat(QUESTION)
    _, together = generate(model, tokenizer, [other, prompt], [SamplingParams(temperature=0), seeded], 8)
    assert together.token_ids == alone.token_ids
