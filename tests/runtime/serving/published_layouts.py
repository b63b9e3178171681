"""Tiny checkpoints written in their publishers' exact layouts, and graphs that read them.

`published_preset(graph, full, tiny)` copies a seed graph with one more preset: the tiny
preset's dims under the full-size preset's weight mappings, so a test serves tiny weights
through exactly the mappings that serve the published ones.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
