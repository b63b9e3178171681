"""SmolLM2-135M served in bf16 (preset smollm2-135m-bf16: bf16 weights and KV cache, oneDNN
GEMMs that accumulate in fp32) against the fp32 preset, both loaded as a worker loads them.

Tolerance: bf16 keeps 8 significand bits (a relative rounding of 2^-9 per stored value), and
the errors of 30 layers add up in logits of magnitude ~25: on these prompts the largest
difference was 0.35..0.54, so logits must agree within 1.0. Greedy tokens can then differ
only where fp32's top-2 margin is below 2 x that bound: "Write a short poem about the sea."
opens with a 0.012 margin (and flips), so for it only the margin is checked; the parity
prompts below have first-token margins of 0.08..1.2. Over 12 greedy tokens their paths meet
near ties too ("List three colours." has a 0.012 margin at its 7th token, which bf16 decode
attention that keeps its softmax weights in fp32 tips): the two generations must agree up to
their first difference, and there the bf16 logits must be within the tolerance of fp32's and
fp32's margin below twice it (a flip the tolerance explains, not a broken step).
"""
from __future__ import annotations

import pytest
import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.kv import KVBlockManager
from runtime.sampling import SamplingParams
from runtime.text.gguf_tokenizer import tokenizer_from_gguf
from runtime.weights.gguf_loader import SMOLLM2, open_gguf
from runtime.worker.loader import load_rank
from tests.runtime.models.decoder_lm.smollm2_factories import _forward, generate
from tests.runtime.serving.conftest import REPO

LOGIT_TOLERANCE = 1.0
PARITY = ["What is the capital of France?", "List three colours.", "What is 2 + 2?"]
NEAR_TIE = "Write a short poem about the sea."
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_from_gguf(open_gguf(SMOLLM2))


def _served_module(preset: str) -> torch.nn.Module:
    plan = compile_file(str(REPO / "graphs/smollm2.yaml"), Options(preset=preset)).plan
    return load_rank(plan, 0, None)["lm"][0]


@pytest.fixture(scope="module")
def models():
    return {dtype: _served_module(preset) for dtype, preset in (("fp32", "smollm2-135m"),
                                                                 ("bf16", "smollm2-135m-bf16"))}


def _prompt_logits(model: torch.nn.Module, prompts: list[list[int]]) -> torch.Tensor:
    blocks = sum(-(-len(p) // 16) for p in prompts)
    with torch.no_grad():
        return _forward(model, KVBlockManager(blocks, 16), model.make_kv_cache(blocks, 16),
                        list(enumerate(prompts))).float()                       # (B, vocab)


def test_bf16_logits_within_tolerance_and_the_same_greedy_tokens(models, tokenizer) -> None:
    assert next(models["bf16"].parameters()).dtype == torch.bfloat16
    prompts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in [*PARITY, NEAR_TIE]]
    fp32, bf16 = (_prompt_logits(models[d], prompts) for d in ("fp32", "bf16"))
    assert (fp32 - bf16).abs().max().item() <= LOGIT_TOLERANCE
    top2 = fp32.topk(2).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    assert margins[-1] < 2 * LOGIT_TOLERANCE            # the near tie is one, so its flip is allowed
    flips = (fp32.argmax(-1) != bf16.argmax(-1)).tolist()
    assert not any(flip and margin > 2 * LOGIT_TOLERANCE for flip, margin in zip(flips, margins))
    greedy = [SamplingParams(temperature=0)] * len(PARITY)
    ours = {d: [g.token_ids for g in generate(models[d], tokenizer, prompts[:len(PARITY)], greedy, NEW_TOKENS)]
            for d in ("fp32", "bf16")}
    for prompt, want, got in zip(prompts, ours["fp32"], ours["bf16"]):
        first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if first is None:
            assert len(got) == len(want)
            continue
        there = {d: _prompt_logits(models[d], [prompt + want[:first]])[0] for d in ("fp32", "bf16")}
        top2 = there["fp32"].topk(2).values
        assert (there["fp32"] - there["bf16"]).abs().max().item() <= LOGIT_TOLERANCE, first
        assert (top2[0] - top2[1]).item() < 2 * LOGIT_TOLERANCE, (first, want, got)
