"""Tiny checkpoints written in their publishers' exact layouts, and graphs that read them.

`published_preset(graph, full, tiny)` copies a seed graph with one more preset: the tiny
preset's dims under the full-size preset's weight mappings, so a test serves tiny weights
through exactly the mappings that serve the published ones.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
import yaml
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tests.runtime.serving.conftest import REPO

PRESET = "tiny-published"


def published_preset(tmp: Path, graph: str, full: str, tiny: str = "tiny",
                     node_dims: dict[str, dict[str, Any]] | None = None, random_weights: bool = False) -> Path:
    """graphs/<graph>.yaml with preset `tiny-published` (tiny dims, `full`'s weight mappings)."""
    data = yaml.safe_load((REPO / "graphs" / f"{graph}.yaml").read_text())
    preset = {**data["presets"][tiny], "random_weights": random_weights}
    data["presets"][PRESET] = {**preset, "weights": data["presets"][full]["weights"]}
    for node, dims in (node_dims or {}).items():
        data["nodes"][node]["dims"] = dims
    path = tmp / f"{graph}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_word_tokenizer(directory: Path, words: list[str], eos: str = "<|end|>") -> None:
    """tokenizer.json + tokenizer_config.json of a whitespace word-level tokenizer (ids by position)."""
    vocab = {w: i for i, w in enumerate(["[UNK]", eos, *words])}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}))








def upstream_encoder(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers VJEPA2Model encoder tensors -> upstream vision_transformer.py names, q/k/v fused."""
    out = {}
    for name, t in hf_state.items():
        if not name.startswith("encoder.") or re.search(r"attention\.(key|value)\.", name):
            continue
        q = re.match(r"encoder\.layer\.(\d+)\.attention\.query\.(weight|bias)", name)
        if q:
            i, kind = q.groups()
            parts = [hf_state[f"encoder.layer.{i}.attention.{p}.{kind}"] for p in ("query", "key", "value")]
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(parts)
            continue
        name = re.sub(r"^encoder\.layer\.(\d+)\.attention\.", r"blocks.\1.attn.", name)
        name = re.sub(r"^encoder\.layer\.(\d+)\.", r"blocks.\1.", name)
        name = name.replace("encoder.layernorm.", "norm.")
        name = name.replace("encoder.embeddings.patch_embeddings.", "patch_embed.")
        out[name] = t
    return out


def write_vjepa2_ac_pickle(directory: Path, encoder: dict[str, torch.Tensor],
                           predictor: dict[str, torch.Tensor]) -> None:
    """directory/vjepa2-ac-vitg.pt as facebookresearch/vjepa2's app/vjepa_droid/train.py saves it: a torch
    pickle of DistributedDataParallel state dicts (`module.` names) with the training state beside them."""
    directory.mkdir(parents=True, exist_ok=True)
    first = next(iter(predictor.values()))
    torch.save({"encoder": _ddp(encoder), "predictor": _ddp(predictor), "target_encoder": _ddp(encoder),
                "opt": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros_like(first)}},
                        "param_groups": [{"lr": 1e-4, "params": [0]}]},
                "scaler": None, "epoch": 315, "loss": 0.25, "batch_size": 8, "world_size": 1, "lr": 1e-4},
               directory / "vjepa2-ac-vitg.pt")


def _ddp(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict as DistributedDataParallel names it."""
    return {f"module.{k}": v for k, v in state.items()}


def write_omni_repository(directory: Path, model: torch.nn.Module) -> None:
    """Qwen3-Omni as published: transformers' own `save_pretrained` (tensor-per-expert shards,
    model.safetensors.index.json, the nested config.json) and the repository's tokenizer."""
    model.save_pretrained(directory, max_shard_size="1MB")
    assert len(list(directory.glob("model-*-of-*.safetensors"))) > 1
    write_word_tokenizer(directory, ["hello", "there", "."])
