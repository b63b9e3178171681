"""A published repository on disk, as `huggingface-cli download REPO --local-dir DIR` leaves it.

Which files hold a node's tensors: the ones its mapping names (`files:`; a `*.index.json` there stands
for the shards it lists, beside it: a diffusers repository's `transformer/...index.json`), else the shards
of `model.safetensors.index.json`, else every `*.safetensors`. A pickled file (`.bin`, `.pt`) is
never read here: its converted `<stem>.safetensors` beside it is (`mstar-run convert-weights`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.model_executor.weights.headers import TensorInfo, read_header

INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


class RepositoryError(FileNotFoundError):
    """A repository directory lacks what a node needs; the message says what to do."""


def repository_files(root: Path, files: list[str]) -> list[Path]:
    """The safetensors files of `root` a mapping reads (see module doc)."""
    if files:
        return [path for name in files for path in
                (_shards(root, name) if name.endswith(".index.json") else [_safetensors_for(root, name)])]
    if (root / INDEX).is_file():
        return _shards(root, INDEX)
    found = sorted(root.glob("*.safetensors"))
    if found:
        return found
    pickles = sorted(p.name for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise RepositoryError(f"{root} holds only pickled checkpoints ({', '.join(pickles)}), which mstar never "
                              f"unpickles when serving; convert them once: mstar-run convert-weights {root}")
    raise RepositoryError(f"{root}: no {INDEX} and no .safetensors files")


def _shards(root: Path, index: str) -> list[Path]:
    """The files a safetensors index lists, in its folder."""
    path = root / index
    if not path.is_file():
        raise RepositoryError(f"{path} not found (the graph's mapping reads it; is the download complete?)")
    folder = str(Path(index).parent)
    shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
    return [_safetensors_for(root, name if folder == "." else f"{folder}/{name}") for name in shards]


def _safetensors_for(root: Path, name: str) -> Path:
    path = root / name
    if path.suffix in PICKLE_SUFFIXES:
        converted = path.with_suffix(".safetensors")
        if not converted.is_file():
            raise RepositoryError(f"{path} is a torch pickle, which mstar never unpickles when serving; convert it "
                                  f"once: mstar-run convert-weights {root} (writes {converted.name})")
        return converted
    if not path.is_file():
        raise RepositoryError(f"{path} not found (the graph's mapping reads it; is the download complete?)")
    return path


def tensor_infos(paths: list[Path]) -> dict[str, TensorInfo]:
    """Every tensor of the files, from their headers only."""
    out: dict[str, TensorInfo] = {}
    for path in paths:
        out.update(read_header(path))
    return out


def read_config(root: Path, name: str = "config.json") -> dict[str, Any]:
    """The repository's JSON config `name` (config.json; BAGEL also ships llm_config.json, vit_config.json)."""
    path = root / name
    if not path.is_file():
        raise RepositoryError(f"{path} not found (the graph checks the preset against it)")
    return json.loads(path.read_text())
