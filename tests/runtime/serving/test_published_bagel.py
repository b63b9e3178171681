"""BAGEL-7B-MoT served from its published layout through `mstar-run --weights ROOT`.

ROOT/BAGEL-7B-MoT holds `ema.safetensors` (the ViT, connector and MoT LM under their published
names, plus the `latent_pos_embed` table mstar rebuilds) and `ae.safetensors` in the original FLUX
autoencoder layout, and a tokenizer; every node of the graph loads through the full-size preset's mappings at start-up
(a wrong rule stops it). The served chat's greedy tokens equal BAGEL's dense LM (restated from
ByteDance-Seed/Bagel) fed the tensors of the same file; a served T2I image equals BAGEL's
`generate_image` loop on that dense LM, decoded by diffusers' AutoencoderKL from `ae.safetensors` as
diffusers' own converter of the original layout (`convert_ldm_vae_checkpoint`) reads it.
"""
from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.components import component_class
from tests.runtime.models.bagel.bagel_lm_helpers import RefSequence, bagel_weights
from bench.bagel_upstream_lm import DenseBagel
from tests.runtime.serving.conftest import http, serve
from bench.bagel_layout import diffusers_vae, flux_layout, reference_vae, write_bagel_configs
from tests.runtime.serving.published_layouts import PRESET, published_preset, write_word_tokenizer

PROMPT, MAX_TOKENS = [7, 40, 41, 300], 6
WORDS = ["a", "red", "cat"]                 # the repository tokenizer's words, ids 2, 3, 4 (write_word_tokenizer)
T2I = {"prompt": "a red cat", "size": "32x48", "seed": 3, "steps": 4, "cfg_text_scale": 4.0}
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
    write_word_tokenizer(repo, WORDS)                             # the repository ships its tokenizer
    write_bagel_configs(repo, llm_dims, plan.node("vit").dims)    # and the configs BAGEL's loader reads
    plan_path = tmp / "plan.bin"
    plan_path.write_bytes(compiled.data)
    for srv in serve(str(plan_path), "--weights", str(tmp / "weights")):
        yield srv, repo, lm, llm_dims, plan


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
    srv, _, lm, dims, _ = bagel
    status, out = http("POST", f"{srv.url}/v1/tasks/chat", {
        "params": {"temperature": 0.0, "max_tokens": MAX_TOKENS}, "inputs": [{"type": "tokens", "ids": PROMPT}]})
    assert status == 200, out
    assert out["token_ids"] == greedy(lm, dims, PROMPT, MAX_TOKENS)


def test_served_image_equals_bagel_and_diffusers_fed_the_same_files(bagel) -> None:
    srv, repo, _, dims, plan = bagel
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)
    out = client.images.generate(model="bagel-7b-mot", prompt=T2I["prompt"], size=T2I["size"],
                                 extra_body={k: T2I[k] for k in ("seed", "steps", "cfg_text_scale")})
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(out.data[0].b64_json))).convert("RGB")).astype(int)
    want = reference_image(repo, dims, plan.node("cfg").args, plan.node("vae_dec")).astype(int)
    assert got.shape == want.shape == (48, 32, 3)
    assert len(np.unique(want)) > 50                        # a real picture, not a clamped flat one
    # fp32 on both sides, summed in other orders (paged vs dense attention, fused CFG step, conv
    # algorithms): a pixel within ~1e-5 of a rounding boundary may land one uint8 level away;
    # a wrong mapping rule (up-block order, 1x1-conv reshape, expert weights) moves pixels by tens
    assert np.abs(got - want).max() <= 1 and (got != want).mean() < 0.01


def reference_image(repo, dims: dict, cfg_args: dict, vae_node) -> np.ndarray:
    """BAGEL's T2I (`interleave_inference` + `generate_image`, restated) on the dense LM read from
    ema.safetensors, decoded by diffusers from ae.safetensors: (H, W, 3) uint8 rounded as the server does."""
    width, height = (int(v) for v in T2I["size"].split("x"))
    ref = DenseBagel(load_file(str(repo / "ema.safetensors")), dims)
    full, cfg_text = RefSequence(ref), RefSequence(ref)       # cfg_text: the text dropped (an empty context)
    full.text([2 + WORDS.index(w) for w in T2I["prompt"].split()])
    shift, steps, scale = 3.0, T2I["steps"], T2I["cfg_text_scale"]     # timestep_shift: the graph default
    t = torch.linspace(1, 0, steps)
    t = shift * t / (1 + (shift - 1) * t)
    # the noise is mstar's convention (generation.Generation.noise): N(0, 1) of (C, H/8, W/8) from the seed
    gen = torch.Generator().manual_seed(T2I["seed"])
    x = torch.randn((dims["latent_channels"], height // 8, width // 8), generator=gen)
    lo, hi = cfg_args["cfg_interval"]
    assert cfg_args["renorm_type"] == "global"                # the renorm restated below
    with torch.no_grad():
        for i in range(steps - 1):
            v = v_full = full.gen(x, float(t[i]))
            if lo < t[i] <= hi and scale > 1.0:                # T2I: cfg_img_scale 1, no image branch
                v_text = cfg_text.gen(x, float(t[i]))
                v_ = v_text + scale * (v_full - v_text)
                v = v_ * (v_full.norm() / (v_.norm() + 1e-8)).clamp(cfg_args["renorm_min"], 1.0)
            x = x - v * (t[i] - t[i + 1])
        vae = reference_vae(load_file(str(repo / "ae.safetensors")), vae_node)
        scaling, shift_factor = vae_node.args["scaling_factor"], vae_node.args["shift_factor"]
        image = vae.decode(x[None] / scaling + shift_factor).sample[0]
    return ((image * 0.5 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
