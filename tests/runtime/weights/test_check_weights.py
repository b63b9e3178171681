"""`mstar-run check-weights` on published-layout directories (real safetensors headers, sparse
data) and `mstar-run` start-up without weights, through the real CLI in subprocesses."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mstar_compiler.plan import Plan, load_plan
from tests.runtime.serving.conftest import REPO, compile_plan
from bench.bagel_layout import write_bagel_configs
from tests.runtime.weights.published_layouts import (BAGEL_LLM, BAGEL_VIT, merge_sections, published_config, repository,
                                                    write_header_only)

ORPHEUS_CONFIG = {"architectures": ["LlamaForCausalLM"], "vocab_size": 156940, "num_hidden_layers": 28,
                  "hidden_size": 3072, "num_attention_heads": 24, "num_key_value_heads": 8,
                  "tie_word_embeddings": True, "torch_dtype": "bfloat16"}

# hubertsiuzdak/snac_24khz's config.json: SNAC's constructor arguments
SNAC_24KHZ_CONFIG = {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
                     "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096,
                     "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True, "depthwise": True}


def write_orpheus_root(root: Path, config: dict = ORPHEUS_CONFIG, rename: tuple[str, str] | None = None,
                       convert_snac: bool = True, snac_config: dict = SNAC_24KHZ_CONFIG) -> Path:
    """ROOT/orpheus-3b-0.1-ft (two shards + index + config.json) and ROOT/snac_24khz (the .bin and,
    unless `convert_snac` is False, its converted .safetensors), laid out as published."""
    lm = root / "orpheus-3b-0.1-ft"
    tensors = dict(next(iter(repository("orpheus-3b-0.1-ft").values())))
    if rename:
        tensors[rename[1]] = tensors.pop(rename[0])
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:120], "model-00002-of-00002.safetensors": names[120:]}
    for file, part in shards.items():
        write_header_only(lm / file, {n: tensors[n] for n in part})
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (lm / "model.safetensors.index.json").write_text(json.dumps(index))
    (lm / "config.json").write_text(json.dumps(config))
    snac = root / "snac_24khz"
    snac.mkdir(parents=True)
    (snac / "pytorch_model.bin").write_bytes(b"not read: serving never unpickles")
    (snac / "config.json").write_text(json.dumps(snac_config))
    if convert_snac:
        write_header_only(snac / "pytorch_model.safetensors", repository("snac_24khz")["pytorch_model.bin"], "F32")
    return root


@pytest.fixture(scope="module")
def orpheus_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_plan(tmp_path_factory.mktemp("orpheus"), "orpheus", preset="orpheus-3b")


def mstar_run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_check_weights_reports_all_matched(orpheus_plan: str, tmp_path: Path) -> None:
    root = write_orpheus_root(tmp_path)
    out = mstar_run("check-weights", orpheus_plan, "--weights", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "node lm (llama_lm) <- canopylabs/orpheus-3b-0.1-ft" in out.stdout
    assert "matched 254, missing 0, unexpected 0, wrong shape 0; 6.15 GiB" in out.stdout
    assert "node snac (snac_decoder) <- hubertsiuzdak/snac_24khz" in out.stdout
    assert "rank 0:" in out.stdout and "all weights match" in out.stdout


def test_check_weights_names_a_renamed_key_and_the_fix(orpheus_plan: str, tmp_path: Path) -> None:
    root = write_orpheus_root(tmp_path, rename=("model.layers.7.self_attn.o_proj.weight",
                                                "model.layers.7.self_attn.out_proj.weight"))
    out = mstar_run("check-weights", orpheus_plan, "--weights", str(root))
    assert out.returncode == 1
    assert "unexpected (1): model.layers.7.self_attn.out_proj.weight" in out.stdout
    assert "missing (1): model.layers.7.self_attn.o_proj.weight" in out.stdout
    assert "fix: another repository or revision? else add an `exclude:` or `rename:` rule" in out.stdout
    assert "MISMATCH" in out.stdout


def test_check_weights_fails_on_a_config_that_disagrees(orpheus_plan: str, tmp_path: Path) -> None:
    root = write_orpheus_root(tmp_path, config={**ORPHEUS_CONFIG, "vocab_size": 128256, "tie_word_embeddings": False},
                              snac_config={**SNAC_24KHZ_CONFIG, "decoder_rates": [8, 4, 4, 2]})
    out = mstar_run("check-weights", orpheus_plan, "--weights", str(root))
    assert out.returncode == 1
    node = "preset 'orpheus-3b' of node 'lm'"
    assert f"config.json `vocab_size` = 128256 but {node} has vocab_size = 156940" in out.stdout
    assert f"`tie_word_embeddings` = False but {node} has tie_word_embeddings = True" in out.stdout
    assert ("config.json `decoder_rates` = [8, 4, 4, 2] but preset '24khz' of node 'snac' has "
            "decoder_rates = [8, 8, 4, 2]") in out.stdout


def test_a_pickle_without_its_conversion_names_convert_weights(orpheus_plan: str, tmp_path: Path) -> None:
    root = write_orpheus_root(tmp_path, convert_snac=False)
    out = mstar_run("check-weights", orpheus_plan, "--weights", str(root))
    assert out.returncode == 1
    assert f"mstar-run convert-weights {root / 'snac_24khz'}" in out.stdout


@pytest.mark.parametrize("with_empty_dir", [True, False])
def test_serving_a_full_size_plan_without_weights_fails_at_start(orpheus_plan: str, tmp_path: Path,
                                                                  with_empty_dir: bool) -> None:
    args = ["--weights", str(tmp_path)] if with_empty_dir else []
    out = mstar_run(orpheus_plan, "--port", "0", *args, timeout=60)   # the bound: it must not start serving
    assert out.returncode == 2
    assert "2 node(s) have no weights: lm, snac" in out.stderr
    assert "node 'lm' (llama_lm, orpheus.yaml:" in out.stderr and "node 'snac' (snac_decoder, orpheus.yaml:" in out.stderr
    assert "reads its weights from canopylabs/orpheus-3b-0.1-ft, which was not found" in out.stderr
    tried = f"{tmp_path / 'orpheus-3b-0.1-ft'} (no such directory)" if with_empty_dir else "nothing: no --weights given"
    assert tried in out.stderr
    assert "huggingface-cli download canopylabs/orpheus-3b-0.1-ft --local-dir ROOT/orpheus-3b-0.1-ft" in out.stderr


def write_omni_root(repo: Path, plan: Plan) -> None:
    """Qwen3-Omni's 15 shards (the published tensors, split in name order), their index, and a config.json
    holding the preset's own values at every key the mappings check (the values themselves are checked by
    test_published_omni against a config transformers writes)."""
    tensors = sorted(next(iter(repository("qwen3-omni-30b-a3b-instruct").values())).items())
    index: dict[str, str] = {}
    for shard in range(15):
        name = f"model-{shard + 1:05d}-of-00015.safetensors"
        part = dict(tensors[shard::15])
        write_header_only(repo / name, part)
        index.update({k: name for k in part})
    (repo / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    config: dict = {}
    for node in plan.nodes:
        if node.weight_map is not None:
            merge_sections(config, published_config(node))
    (repo / "config.json").write_text(json.dumps(config))


def write_full_root(root: Path, graph: str, plan: Plan) -> None:
    """The published directories of `graph`'s full-size preset: real headers, sparse data."""
    if graph == "qwen3_omni":
        write_omni_root(root / "Qwen3-Omni-30B-A3B-Instruct", plan)
    elif graph == "bagel":
        for file, tensors in repository("bagel-7b-mot").items():
            write_header_only(root / "BAGEL-7B-MoT" / file, tensors)
        write_bagel_configs(root / "BAGEL-7B-MoT", BAGEL_LLM, BAGEL_VIT)
    else:
        lists = repository("vjepa2-vitg")
        tensors = {f"{part}.module.backbone.{k}": v for part in ("encoder", "predictor")
                   for k, v in lists[f"vjepa2-ac-vitg.pt: {part}"].items()}
        write_header_only(root / "vjepa2" / "vjepa2-ac-vitg.safetensors", tensors, "F32")
        (root / "vjepa2" / "vjepa2-ac-vitg.pt").write_bytes(b"not read")


@pytest.mark.parametrize("graph,preset", [("bagel", "bagel-7b"), ("vjepa2_ac", "vitg"),
                                          ("qwen3_omni", "qwen3-omni-30b-a3b")])
def test_check_weights_on_full_size_presets(tmp_path: Path, graph: str, preset: str) -> None:
    plan = compile_plan(tmp_path, graph, preset=preset)
    write_full_root(tmp_path / "root", graph, load_plan(plan))
    out = mstar_run("check-weights", plan, "--weights", str(tmp_path / "root"), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all weights match" in out.stdout and "missing 0, unexpected 0, wrong shape 0" in out.stdout



# openai/whisper-large-v3's config.json: the WhisperConfig values its mapping checks
WHISPER_LARGE_V3_CONFIG = {"architectures": ["WhisperForConditionalGeneration"], "vocab_size": 51866,
                           "num_mel_bins": 128, "d_model": 1280, "encoder_layers": 32, "decoder_layers": 32,
                           "encoder_attention_heads": 20, "decoder_attention_heads": 20, "encoder_ffn_dim": 5120,
                           "decoder_ffn_dim": 5120, "max_source_positions": 1500, "max_target_positions": 448,
                           "torch_dtype": "float16"}


@pytest.fixture(scope="module")
def whisper_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_plan(tmp_path_factory.mktemp("whisper"), "whisper", preset="large-v3")


def write_whisper_root(root: Path, rename: tuple[str, str] | None = None) -> Path:
    repo = root / "whisper-large-v3"
    tensors = dict(repository("whisper-large-v3")["model.safetensors"])
    if rename:
        tensors[rename[1]] = tensors.pop(rename[0])
    write_header_only(repo / "model.safetensors", tensors, "F16")
    (repo / "config.json").write_text(json.dumps(WHISPER_LARGE_V3_CONFIG))
    return root


def test_check_weights_of_whisper_large_v3(whisper_plan: str, tmp_path: Path) -> None:
    out = mstar_run("check-weights", whisper_plan, "--weights", str(write_whisper_root(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "node encoder (whisper_encoder) <- openai/whisper-large-v3" in out.stdout
    assert "node decoder (whisper_decoder) <- openai/whisper-large-v3" in out.stdout
    assert "matched 487, missing 0, unexpected 0, wrong shape 0" in out.stdout     # 32 x 15 + 7
    assert "matched 772, missing 0, unexpected 0, wrong shape 0" in out.stdout     # 32 x 24 + 4
    assert "all weights match" in out.stdout


def test_check_weights_of_whisper_names_a_renamed_tensor(whisper_plan: str, tmp_path: Path) -> None:
    root = write_whisper_root(tmp_path, rename=("model.decoder.layers.3.encoder_attn.k_proj.weight",
                                                "model.decoder.layers.3.cross_attn.k_proj.weight"))
    out = mstar_run("check-weights", whisper_plan, "--weights", str(root))
    assert out.returncode == 1
    assert "missing (1): layers.3.encoder_attn.k_proj.weight" in out.stdout
    assert "unexpected (1): model.decoder.layers.3.cross_attn.k_proj.weight" in out.stdout


# Tongyi-MAI/Z-Image-Turbo's config files: the values its mapping checks
Z_IMAGE_CONFIGS = {
    "text_encoder/config.json": {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 2560,
                                 "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
                                 "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"},
    "transformer/config.json": {"_class_name": "ZImageTransformer2DModel", "dim": 3840, "n_layers": 30,
                                "n_refiner_layers": 2, "n_heads": 30, "cap_feat_dim": 2560, "in_channels": 16},
    "vae/config.json": {"_class_name": "AutoencoderKL", "latent_channels": 16},
}


def write_zimage_root(root: Path, rename: tuple[str, str] | None = None) -> Path:
    """root/Z-Image-Turbo/ as published: sharded text_encoder/ and transformer/ with their indexes, vae/."""
    repo = root / "Z-Image-Turbo"
    indexes: dict[str, dict[str, str]] = {}
    for file, tensors in repository("z-image-turbo").items():
        tensors = dict(tensors)
        if rename and rename[0] in tensors:
            tensors[rename[1]] = tensors.pop(rename[0])
        write_header_only(repo / file, tensors, "BF16")
        folder, name = file.split("/")
        if folder != "vae":
            indexes.setdefault(folder, {}).update({t: name for t in tensors})
    stems = {"text_encoder": "model", "transformer": "diffusion_pytorch_model"}
    for folder, weight_map in indexes.items():
        index = repo / folder / f"{stems[folder]}.safetensors.index.json"
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for name, config in Z_IMAGE_CONFIGS.items():
        (repo / name).write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def zimage_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_plan(tmp_path_factory.mktemp("zimage"), "zimage", preset="turbo")


def test_check_weights_of_z_image_turbo(zimage_plan: str, tmp_path: Path) -> None:
    out = mstar_run("check-weights", zimage_plan, "--weights", str(write_zimage_root(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    for node in ("text_enc (zimage_text_encoder)", "dit (zimage_dit)", "vae_dec (vae_decoder)"):
        assert f"node {node} <- Tongyi-MAI/Z-Image-Turbo" in out.stdout
    assert "matched 398, missing 0, unexpected 0, wrong shape 0" in out.stdout     # 36 x 11 + 2
    assert "matched 521, missing 0, unexpected 0, wrong shape 0" in out.stdout     # the DiT, every tensor
    assert "all weights match" in out.stdout


def test_check_weights_of_z_image_names_a_renamed_tensor(zimage_plan: str, tmp_path: Path) -> None:
    root = write_zimage_root(tmp_path, rename=("layers.7.attention.to_k.weight", "layers.7.attention.k.weight"))
    out = mstar_run("check-weights", zimage_plan, "--weights", str(root))
    assert out.returncode == 1
    assert "missing (1): layers.7.attention.to_k.weight" in out.stdout
    assert "unexpected (1): layers.7.attention.k.weight" in out.stdout


def write_pi05_root(root: Path, rename: tuple[str, str] | None = None) -> Path:
    tensors = dict(repository("pi05_base")["model.safetensors"])
    if rename:
        tensors[rename[1]] = tensors.pop(rename[0])
    write_header_only(root / "pi05_base" / "model.safetensors", tensors, "F32")
    return root


@pytest.fixture(scope="module")
def pi05_plan(tmp_path_factory: pytest.TempPathFactory) -> str:
    return compile_plan(tmp_path_factory.mktemp("pi05"), "pi05", preset="pi05-base")


def test_check_weights_of_pi05_base(pi05_plan: str, tmp_path: Path) -> None:
    out = mstar_run("check-weights", pi05_plan, "--weights", str(write_pi05_root(tmp_path)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "node prefix (pi05_prefix) <- lerobot/pi05_base" in out.stdout
    assert "node expert (pi05_expert) <- lerobot/pi05_base" in out.stdout
    # SigLIP 27 x 16 + 5, projector 2, Gemma 18 x 9 + 2 (its table stored as lm_head)
    assert "matched 603, missing 0, unexpected 0, wrong shape 0" in out.stdout
    assert "matched 208, missing 0, unexpected 0, wrong shape 0" in out.stdout     # 18 x 11 + 2 + 8
    assert "all weights match" in out.stdout


def test_check_weights_of_pi05_names_a_renamed_tensor(pi05_plan: str, tmp_path: Path) -> None:
    root = write_pi05_root(tmp_path, rename=("paligemma_with_expert.gemma_expert.model.layers.5.mlp.up_proj.weight",
                                             "paligemma_with_expert.gemma_expert.model.layers.5.mlp.up.weight"))
    out = mstar_run("check-weights", pi05_plan, "--weights", str(root))
    assert out.returncode == 1
    assert "missing (1): dit.layers.5.mlp.up_proj.weight" in out.stdout
    assert "unexpected (1): paligemma_with_expert.gemma_expert.model.layers.5.mlp.up.weight" in out.stdout
