"""The published checkpoints' tensor names and shapes (copied from ../shared/checkpoints, see
published/README.md), and helpers that run the real mapping against them on the meta device.

`repository(name)` gives {file: {tensor: shape}}; `write_repository` lays one out on disk with
real safetensors headers and no data (sparse files), so `check-weights` reads it as it would
the download.
"""
from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path
from typing import Any

from mstar_compiler.plan import Node
from runtime.model_executor.weights.headers import TensorInfo
from runtime.model_executor.weights.mapping import CompiledMap
from runtime.model_executor.weights.match import MatchReport, match_node
from runtime.model_executor.weights.slots import Slot
from runtime.worker.loader import meta_slots

HERE = Path(__file__).parent / "published"

# BAGEL-7B-MoT's llm_config.json (Qwen2.5-7B-Instruct's) and vit_config.json (SigLIP so400m/14 at 980 px) as
# the node dims write_bagel_configs takes: the ViT's 26 layers are published as 27 (BAGEL drops the last)
BAGEL_LLM = {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06}
BAGEL_VIT = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 26, "num_attention_heads": 16,
             "patch_size": 14, "max_num_patch_per_side": 70, "layer_norm_eps": 1e-06}
_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


def repository(name: str) -> dict[str, dict[str, list[int]]]:
    """{file: {tensor: shape}} of a published repository list (e.g. "orpheus-3b-0.1-ft")."""
    return json.loads(gzip.open(HERE / f"{name}.json.gz").read())["files"]


def infos(tensors: dict[str, list[int]], file: str = "model.safetensors", dtype: str = "BF16") -> dict[str, TensorInfo]:
    """TensorInfos as a header would give them."""
    size = _DTYPE_BYTES[dtype]
    return {n: TensorInfo(Path(file), dtype, tuple(s), size * _numel(s)) for n, s in tensors.items()}


def meta_report(node: Node, published: dict[str, TensorInfo], slots: dict[str, Slot] | None = None) -> MatchReport:
    """The node's slots (built on the meta device unless given) matched through its plan mapping
    against the published tensors of the files the mapping reads."""
    assert node.weight_map is not None, f"node {node.name} has no weight mapping"
    files = {name for f in node.weight_map.files for name in (f, str(Path(f).with_suffix(".safetensors")))}
    mine = {k: v for k, v in published.items() if not files or v.file.name in files}
    return match_node(node.name, CompiledMap(node.weight_map), mine, meta_slots(node) if slots is None else slots)


def write_header_only(path: Path, tensors: dict[str, list[int]], dtype: str = "BF16") -> None:
    """A safetensors file with a real header and zero-filled (sparse) data."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        nbytes = _DTYPE_BYTES[dtype] * _numel(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def published_config(node: Node) -> dict[str, Any]:
    """The node's config file as published: the preset's value at every key its mapping checks."""
    assert node.weight_map is not None
    config: dict[str, Any] = {}
    for key, dim in node.weight_map.config.items():
        *parents, field = key.split(".")
        section = config
        for part in parents:
            section = section.setdefault(part, {})
        section[field] = json.loads(json.dumps(node.dims[dim]))
    return config


def merge_sections(into: dict[str, Any], config: dict[str, Any]) -> None:
    """Add `config`'s keys to `into`, section by section (several nodes read one config.json)."""
    for key, value in config.items():
        if isinstance(value, dict):
            merge_sections(into.setdefault(key, {}), value)
        else:
            into[key] = value
