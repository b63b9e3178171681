"""Qwen3-Omni served from its published layout through `mstar-run --weights ROOT`.

ROOT/Qwen3-Omni-30B-A3B-Instruct is one repository for every component, as transformers'
`save_pretrained` lays it out (sharded safetensors, model.safetensors.index.json, the nested
config.json) plus a tokenizer; each of the six nodes reads its part through the full-size preset's
mapping (prefixes, the thinker's and talker's excludes, the config.json check). The served chat's
greedy tokens equal transformers' Qwen3-Omni thinker fed the same files.
"""
from __future__ import annotations

import pytest
import torch

from mstar_compiler.catalogue.silero_vad import WEIGHTS as VAD_WEIGHTS
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from tests.runtime.models.qwen3_omni.omni_reference import hf_model, omni_config, preset, randomize
from tests.runtime.serving.conftest import http, serve
from tests.runtime.serving.published_layouts import PRESET, published_preset, write_omni_repository

PROMPT, MAX_TOKENS = [5, 17, 200, 3, 99], 6
EOS = 1               # the repository tokenizer's `<|end|>` (write_word_tokenizer), where the server stops
REPOSITORY = "Qwen3-Omni-30B-A3B-Instruct"


@pytest.fixture(scope="module")
def omni(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("omni-published")
    compiled = compile_file(str(published_preset(tmp, "qwen3_omni", "qwen3-omni-30b-a3b")), Options(preset=PRESET))
    torch.manual_seed(0)
    reference = hf_model.Qwen3OmniMoeForConditionalGeneration(omni_config(preset("qwen3_moe_lm"))).eval()
    randomize(reference, seed=11)
    root = tmp / "weights"
    write_omni_repository(root / REPOSITORY, reference)
    plan_path = tmp / "plan.bin"
    plan_path.write_bytes(compiled.data)
    for srv in serve(str(plan_path), "--weights", str(root)):
        yield srv, root, reference


def greedy(reference: torch.nn.Module, prompt: list[int], count: int) -> list[int]:
    """transformers' thinker, argmax one token at a time (no cache: the reference arithmetic)."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(count):
            token = int(reference.thinker(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            if token == EOS:
                break
            ids.append(token)
    return out


def test_every_node_reads_the_one_repository(omni) -> None:
    srv, root, *_ = omni
    card = http("GET", f"{srv.url}/v1/models")[1]["data"][0]
    weights = dict(card["weights"])
    assert weights.pop("vad") == VAD_WEIGHTS              # the voice activity detector's come with its wheel
    assert set(weights.values()) == {str(root / REPOSITORY)} and len(weights) == 6
    assert card["random_weights"] == []


def test_served_chat_tokens_equal_transformers_thinker(omni) -> None:
    srv, _, reference = omni
    status, out = http("POST", f"{srv.url}/v1/tasks/chat", {
        "params": {"temperature": 0.0, "max_tokens": MAX_TOKENS}, "inputs": [{"type": "tokens", "ids": PROMPT}]})
    assert status == 200, out
    assert out["token_ids"] == greedy(reference, PROMPT, MAX_TOKENS)
