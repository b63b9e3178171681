"""Tiny checkpoints in each publisher's exact layout served through `mstar-run --weights ROOT`,
outputs equal to the reference implementations fed the same files.

Orpheus: ROOT/orpheus-3b-0.1-ft as transformers' `save_pretrained` shards it (index, config.json,
tied embeddings without lm_head) and ROOT/snac_24khz as a `pytorch_model.bin` pickle converted by
`mstar-run convert-weights`; the served tokens equal transformers' greedy choice under Orpheus'
audio-slot rule and the served audio equals `snac.SNAC.decode` of those codes.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from snac import SNAC

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.models.orpheus.codes import tokens_to_codes
from tests.runtime.models.decoder_lm.lm_factories import hf_twin
from tests.runtime.serving.conftest import REPO, Server, http
from tests.runtime.serving.published_layouts import PRESET, published_preset, write_word_tokenizer

OFFSET, CODEBOOK, END_OF_SPEECH = 128266, 4096, 128258
PROMPT = [3, 4, 5, 6, 7]


def write_orpheus_lm(root: Path, dims: dict) -> transformers.PreTrainedModel:
    """ROOT/orpheus-3b-0.1-ft: transformers' sharded safetensors + index + config.json + tokenizer."""
    model = hf_twin("llama_lm", dims, seed=3)
    directory = root / "orpheus-3b-0.1-ft"
    model.save_pretrained(directory, max_shard_size="20MB")
    config = json.loads((directory / "config.json").read_text())
    # the published config.json spells these out (save_pretrained drops values equal to its defaults)
    config.update({k: dims[k] for k in ("vocab_size", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                        "num_key_value_heads", "tie_word_embeddings")})
    (directory / "config.json").write_text(json.dumps(config))
    write_word_tokenizer(directory, ["tara", ":", "hello", "there", "."])
    return model


def write_snac(root: Path, dims: dict) -> SNAC:
    """ROOT/snac_24khz: `pytorch_model.bin` (a torch pickle, as published) + config.json."""
    directory = root / "snac_24khz"
    directory.mkdir(parents=True)
    # SNAC's constructor arguments, as published (SNAC.from_config reads them)
    config = {"sampling_rate": dims["sampling_rate"], "encoder_dim": 4, "encoder_rates": [2, 2],
              "latent_dim": dims["latent_dim"], "decoder_dim": dims["decoder_dim"],
              "decoder_rates": list(dims["decoder_rates"]), "attn_window_size": None,
              "codebook_size": dims["codebook_size"], "codebook_dim": dims["codebook_dim"],
              "vq_strides": list(dims["vq_strides"]), "noise": True, "depthwise": True}
    (directory / "config.json").write_text(json.dumps(config))
    torch.manual_seed(4)
    ref = SNAC.from_config(str(directory / "config.json")).eval()
    torch.save(ref.state_dict(), directory / "pytorch_model.bin")
    return ref


@pytest.fixture(scope="module")
def orpheus(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("orpheus-published")
    graph = published_preset(tmp, "orpheus", "orpheus-3b", node_dims={"lm": {"tie_word_embeddings": True}})
    plan = compile_file(str(graph), Options(preset=PRESET)).plan
    root = tmp / "weights"
    lm = write_orpheus_lm(root, plan.node("lm").dims)
    snac = write_snac(root, plan.node("snac").dims)
    converted = subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "convert-weights", str(root / "snac_24khz")],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
    assert converted.returncode == 0, converted.stderr
    plan_path = tmp / "plan.bin"
    plan_path.write_bytes(compile_file(str(graph), Options(preset=PRESET)).data)
    srv = Server(str(plan_path), "--weights", str(root), env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(180)
        yield srv, root, lm, snac, converted.stdout
    finally:
        assert srv.stop() == 0


def greedy_audio_tokens(lm: transformers.PreTrainedModel, prompt: list[int], count: int) -> list[int]:
    """transformers' logits, argmax under Orpheus' rule: slot p % 7's 4096 ids, end-of-speech at frame starts."""
    ids = list(prompt)
    out: list[int] = []
    for p in range(count):
        with torch.no_grad():
            logits = lm(torch.tensor([ids])).logits[0, -1]
        candidates = list(range(OFFSET + CODEBOOK * (p % 7), OFFSET + CODEBOOK * (p % 7 + 1)))
        candidates += [END_OF_SPEECH] if p % 7 == 0 else []
        token = candidates[int(logits[candidates].argmax())]
        if token == END_OF_SPEECH:
            break
        out.append(token)
        ids.append(token)
    return out


def test_convert_weights_says_what_it_wrote(orpheus) -> None:
    _, root, _, _, stdout = orpheus
    source, target = root / "snac_24khz" / "pytorch_model.bin", root / "snac_24khz" / "pytorch_model.safetensors"
    assert f"{source} -> {target}: " in stdout and target.is_file()


def test_models_and_health_name_the_repositories_and_no_random_weights(orpheus) -> None:
    srv, root, *_ = orpheus
    _, models = http("GET", f"{srv.url}/v1/models")
    card = models["data"][0]
    assert card["weights"] == {"lm": str(root / "orpheus-3b-0.1-ft"), "snac": str(root / "snac_24khz")}
    assert card["random_weights"] == []
    assert http("GET", f"{srv.url}/health")[1]["random_weights"] == []


def test_served_speech_equals_transformers_and_snac(orpheus) -> None:
    srv, _, lm, snac, _ = orpheus
    status, out = http("POST", f"{srv.url}/v1/tasks/speech", {
        "params": {"temperature": 0.0, "max_tokens": 28}, "inputs": [{"type": "tokens", "ids": PROMPT}]})
    assert status == 200, out
    expected = greedy_audio_tokens(lm, PROMPT, 28)
    assert out["token_ids"] == expected
    (audio,) = out["tensors"].values()
    served = torch.from_numpy(np.frombuffer(base64.b64decode(audio["data"]), dtype=audio["dtype"]).copy())
    levels, valid = tokens_to_codes(torch.tensor([expected]), OFFSET, CODEBOOK)
    assert valid.all()
    for module in snac.decoder.modules():        # the served decoder adds no noise (catalogue arg)
        if type(module).__name__ == "NoiseBlock":
            module.linear.parametrizations.weight.original0.data.zero_()
    with torch.no_grad():
        reference = snac.decode(levels)[0, 0]
    # fp32 both sides; the convolutions run in another order (batched windows): a few ulps
    torch.testing.assert_close(served, reference, rtol=1e-4, atol=1e-5)
