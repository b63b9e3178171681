"""BAGEL-7B-MoT served from its published layout through `mstar-run --weights ROOT`.

ROOT/BAGEL-7B-MoT holds `ema.safetensors` (the ViT, connector and MoT LM under their published
names, plus the `latent_pos_embed` table mstar rebuilds) and `ae.safetensors` in the original FLUX
autoencoder layout, and a tokenizer; every node of the graph loads through the full-size preset's mappings at start-up
(a wrong rule stops it). The served chat's greedy tokens equal BAGEL's dense LM (restated from
ByteDance-Seed/Bagel) fed the tensors of the same file.
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.components import component_class
from tests.runtime.models.bagel.bagel_lm_helpers import RefSequence, bagel_weights
from tests.runtime.models.bagel.bagel_reference import DenseBagel
from tests.runtime.serving.conftest import http, serve
from tests.runtime.serving.published_layouts import (PRESET, diffusers_vae, flux_layout, published_preset,
                                                     write_word_tokenizer)

PROMPT, MAX_TOKENS = [7, 40, 41, 300], 6
TOKENIZER_EOS = 1     # the repository tokenizer's `<|end|>` (write_word_tokenizer): the server stops there too


def vit_tensors(dims: dict, args: dict) -> dict[str, torch.Tensor]:
    """The `siglip_vit` node's published tensors (vit_model.*, connector.*, vit_pos_embed.*), random."""
    torch.manual_seed(2)
    vit = component_class("siglip_vit")(dims, {**args, "weights": None})
    return {k: v.contiguous() for k, v in vit.state_dict().items()}


@pytest.fixture(scope="module")
def bagel(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("bagel-published")
    compiled = compile_file(str(published_preset(tmp, "bagel", "bagel-7b")), Options(preset=PRESET))
    plan = compiled.plan
    llm_dims = plan.node("llm").dims
    lm = bagel_weights(llm_dims, seed=5)
    ema = {**lm, **vit_tensors(plan.node("vit").dims, plan.node("vit").args),
           "latent_pos_embed.pos_embed": torch.randn(16, llm_dims["hidden_size"])}
    vae = plan.node("vae_dec")
    repo = tmp / "weights" / "BAGEL-7B-MoT"
    repo.mkdir(parents=True)
    save_file(ema, str(repo / "ema.safetensors"))
    save_file(flux_layout(diffusers_vae(vae.dims, vae.args).state_dict(), len(vae.dims["block_out_channels"])),
              str(repo / "ae.safetensors"))
    write_word_tokenizer(repo, ["a", "red", "cat"])               # the repository ships its tokenizer
    plan_path = tmp / "plan.bin"
    plan_path.write_bytes(compiled.data)
    for srv in serve(str(plan_path), "--weights", str(tmp / "weights")):
        yield srv, repo, lm, llm_dims


def greedy(lm: dict[str, torch.Tensor], dims: dict, prompt: list[int], count: int) -> list[int]:
    """BAGEL's dense LM: the prompt as one text block, then argmax decoding from <|im_start|> to an end token."""
    seq, token, out = RefSequence(DenseBagel(lm, dims)), dims["bos_token_id"], []
    seq.text(prompt)
    with torch.no_grad():
        for _ in range(count):
            token = int(seq.decode(token).argmax())
            out.append(token)
            if token in (dims["eos_token_id"], TOKENIZER_EOS):
                break
    return out


def test_every_node_reads_the_published_repository(bagel) -> None:
    srv, repo, *_ = bagel
    card = http("GET", f"{srv.url}/v1/models")[1]["data"][0]
    assert card["weights"] == {n: str(repo) for n in ("vit", "vae_enc", "llm", "llm_cfg_text", "llm_cfg_img",
                                                      "vae_dec")} | {"cfg": "none"}
    assert card["random_weights"] == []


def test_served_chat_tokens_equal_dense_bagel(bagel) -> None:
    srv, _, lm, dims = bagel
    status, out = http("POST", f"{srv.url}/v1/tasks/chat", {
        "params": {"temperature": 0.0, "max_tokens": MAX_TOKENS}, "inputs": [{"type": "tokens", "ids": PROMPT}]})
    assert status == 200, out
    assert out["token_ids"] == greedy(lm, dims, PROMPT, MAX_TOKENS)
