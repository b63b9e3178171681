"""One set of Orpheus-3B weights every side of the `orpheus-3b` suite serves, written once under .bench/orpheus-3b/.

No checkpoint can be downloaded here, and random weights at the published shapes stream and multiply
exactly as the real ones do, so the suite writes them, laid out as the published repositories are:

  .bench/orpheus-3b/orpheus-3b-0.1-ft/   canopylabs/orpheus-3b-0.1-ft's layout: config.json (LlamaConfig,
                                         Llama-3.2-3B shapes, vocabulary 156,940, tied embeddings),
                                         model.safetensors in bf16 (seeded normal weights, std 0.02; norms 1),
                                         tokenizer.json (below); mstar-run reads it with --weights, vLLM serves it
  .bench/orpheus-3b/snac_24khz/          hubertsiuzdak/snac_24khz's layout: config.json and pytorch_model.bin
                                         (the `snac` package's SNAC 24 kHz, seeded), then `mstar-run
                                         convert-weights` writes pytorch_model.safetensors, which mstar serves and
                                         the peers' client decodes with (bench.orpheus_client)
  .bench/orpheus-3b/orpheus-3b-bf16.gguf llama.cpp's own convert_hf_to_gguf.py of the LM directory, --outtype bf16

The tokenizer: Orpheus' own (Llama 3's, extended) cannot be fetched, so tokenizer.json is SmolLM2's byte-level
BPE (tools/setup_vllm_cpu.sh's export) with added tokens up to the vocabulary of 156,940 at Orpheus' special ids
(128000 <|begin_of_text|>, 128009 <|eot_id|>, 128256 + N <custom_token_N>: 128257 start of speech ... 128266 the
first audio token). Every side gets the same prompt ids: mstar tokenizes the text with it, the peers' client sends
the ids it makes (runtime.models.orpheus.serving.orpheus_prompt over the same file).
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.registry import Context, Needs

LM_REPO, SNAC_REPO = "orpheus-3b-0.1-ft", "snac_24khz"
VOCAB = 156940
LLAMA_3B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24, "num_key_value_heads": 8,
            "head_dim": 128, "vocab_size": VOCAB, "max_position_embeddings": 131072, "rope_theta": 500000.0,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128009}
SNAC_24KHZ = {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
              "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "vq_strides": [4, 2, 1], "noise": True,
              "depthwise": True, "codebook_size": 4096, "codebook_dim": 8}
SPECIAL = {128000: "<|begin_of_text|>", 128009: "<|eot_id|>"}
SEED = 1234
RECIPE = "2: seeded normal std 0.02, norms 1, speaks audio tokens"   # a checkpoint of another recipe is rewritten
ON, AUDIO, NEURON, AUDIO_FIRST = 0, 1, 0, 128266   # hidden dims and layer-0 MLP neuron of _speak_audio_tokens


@dataclass(frozen=True)
class Orpheus3B:
    """Where the suite's weights are."""

    root: Path          # --weights ROOT for mstar-run
    lm: Path            # the LM's HF directory (vLLM's --model)
    snac: Path          # SNAC's directory
    gguf: Path          # llama.cpp's bf16 GGUF

    @property
    def snac_safetensors(self) -> Path:
        return self.snac / "pytorch_model.safetensors"


def ensure(ctx: Context) -> Orpheus3B:
    """The suite's weights, written now if they are not there yet (minutes, ~13 GB on disk); each step is skipped
    once its file is there."""
    root = ctx.bench_dir / "orpheus-3b"
    files = Orpheus3B(root, root / LM_REPO, root / SNAC_REPO, root / "orpheus-3b-bf16.gguf")
    files.lm.mkdir(parents=True, exist_ok=True)
    files.snac.mkdir(parents=True, exist_ok=True)
    if not (files.lm / "tokenizer.json").is_file():
        _write_tokenizer(ctx.bench_dir / "smollm2-135m-fp32", files.lm)
    if _recipe(files.lm / "model.safetensors") != RECIPE:     # missing, or written by another recipe
        files.gguf.unlink(missing_ok=True)                      # made from the old weights
        _write_lm(files.lm)
    if not files.snac_safetensors.is_file():
        _write_snac(files.snac)
    if not files.gguf.is_file():
        _convert_gguf(ctx, files)
    return files


def _write_tokenizer(smollm2: Path, out: Path) -> None:
    source = smollm2 / "tokenizer.json"
    if not source.is_file():
        raise Needs(f"SmolLM2's tokenizer ({source}), the base of the suite's Orpheus tokenizer: run "
                    "`bash tools/setup_vllm_cpu.sh`")
    spec = json.loads(source.read_text())
    base = len(spec["model"]["vocab"])
    taken = {t["id"] for t in spec["added_tokens"]}
    for i in range(base, VOCAB):
        if i in taken:
            continue
        name = SPECIAL.get(i) or (f"<custom_token_{i - 128256}>" if i >= 128256 else f"<|reserved_special_token_{i}|>")
        spec["added_tokens"].append({"id": i, "content": name, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": SPECIAL[128000], "eos_token": SPECIAL[128009], "model_max_length": 131072,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=1))
    (out / "config.json").write_text(json.dumps(LLAMA_3B, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 128000, "eos_token_id": 128009}))


def _lm_shapes() -> dict[str, tuple[int, ...]]:
    h, f, kv = LLAMA_3B["hidden_size"], LLAMA_3B["intermediate_size"], 8 * 128
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, h), "model.norm.weight": (h,)}
    for i in range(LLAMA_3B["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f),
                       p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
    return shapes


def _write_lm(out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {}
    for i, (name, shape) in enumerate(_lm_shapes().items()):
        if len(shape) == 1:
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        g = torch.Generator().manual_seed(SEED + i)
        tensors[name] = torch.randn(shape, generator=g).mul_(0.02).to(torch.bfloat16)
    _speak_audio_tokens(tensors)
    part = out / "model.safetensors.part"
    save_file(tensors, str(part), metadata={"format": "pt", "mstar_bench_recipe": RECIPE})
    part.rename(out / "model.safetensors")


def _recipe(path: Path) -> str | None:
    """The recipe a suite checkpoint was written by (its header's metadata), None if there is none."""
    from runtime.model_executor.weights.headers import read_metadata
    return read_metadata(path).get("mstar_bench_recipe") if path.is_file() else None


def _speak_audio_tokens(tensors: dict) -> None:
    """Make the random LM emit audio tokens, as a trained Orpheus does, by setting a few of its weights.

    Sampled freely, random weights emit text tokens ~82 % of the time; a served LM then streams text the
    model would never write (llama-server holds back a byte token that is not whole UTF-8 until the end,
    and its stream stalls), and any end-of-text token may stop a stream. So: every token's embedding
    carries a constant on hidden dimension ON; layer 0's attention writes nothing (o_proj zero), so one
    MLP neuron of layer 0 reads that constant and writes a large positive value on dimension AUDIO, which
    then dominates the residual at every position; each audio
    token's embedding (tied: also its LM-head row) is +0.5 on AUDIO and every other token's -0.5, so the
    audio tokens' logits lead the rest by ~18 nats at temperature 0.6. Speed and memory are those of any
    other weights: the shapes, dtype and work are unchanged.
    """
    embed = tensors["model.embed_tokens.weight"]
    embed[:, ON] = 1.0
    embed[:, AUDIO] = -0.5
    embed[AUDIO_FIRST:, AUDIO] = 0.5
    tensors["model.layers.0.self_attn.o_proj.weight"].zero_()
    gate, up, down = (tensors[f"model.layers.0.mlp.{p}_proj.weight"] for p in ("gate", "up", "down"))
    gate[NEURON].zero_()
    up[NEURON].zero_()
    down[:, NEURON] = 0.0
    gate[NEURON, ON] = up[NEURON, ON] = 0.1
    down[AUDIO, NEURON] = 10.0


def _write_snac(out: Path) -> None:
    import torch
    from snac import SNAC

    torch.manual_seed(SEED)
    model = SNAC(**SNAC_24KHZ)
    (out / "config.json").write_text(json.dumps(SNAC_24KHZ, indent=1))
    # the published file is a torch.save pickle; mstar serves only what convert-weights makes of it
    torch.save(model.state_dict(), out / "pytorch_model.bin")
    mstar_run = Path(sys.executable).parent / "mstar-run"
    done = subprocess.run([str(mstar_run), "convert-weights", str(out.parent)], capture_output=True, text=True)
    if done.returncode != 0 or not (out / "pytorch_model.safetensors").is_file():
        raise Needs(f"`mstar-run convert-weights {out.parent}` to write {out / 'pytorch_model.safetensors'}: "
                    f"{(done.stderr or done.stdout).strip()[-300:]}")


def _convert_gguf(ctx: Context, files: Orpheus3B) -> None:
    convert, py = ctx.bench_dir / "llama.cpp/convert_hf_to_gguf.py", ctx.bench_dir / "llamacpp-venv/bin/python"
    if not convert.is_file() or not py.is_file():
        raise Needs(f"llama.cpp's converter ({convert}) and its venv ({py}): run `bash tools/setup_llamacpp.sh`")
    part = files.gguf.with_suffix(".gguf.part")
    done = subprocess.run([str(py), str(convert), str(files.lm), "--outtype", "bf16", "--outfile", str(part)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        part.unlink(missing_ok=True)
        raise Needs(f"llama.cpp's convert_hf_to_gguf.py of {files.lm}: {done.stderr.strip()[-400:]}")
    part.rename(files.gguf)

