"""Reading HF safetensors checkpoints: one file or a directory of shards, lazily, with progress.

`iter_safetensors(path)` yields (name, tensor) one tensor at a time so a model can load a
checkpoint larger than what it keeps (tensor-parallel shards); a tqdm bar counts tensors
when there are many. Never pickle: safetensors only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open
from tqdm import tqdm

# below this many tensors a progress bar is noise
_PROGRESS_MIN_TENSORS = 64


def checkpoint_files(path: str | Path) -> list[Path]:
    """The .safetensors files of a checkpoint: `path` itself, or every one in the directory."""
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {path}")
    return files


def iter_safetensors(path: str | Path, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the checkpoint at `path`, read one at a time."""
    files = checkpoint_files(path)
    names = {}
    for f in files:
        with safe_open(str(f), framework="pt", device=device) as reader:
            names[f] = list(reader.keys())
    total = sum(len(n) for n in names.values())
    with tqdm(total=total, desc=f"loading {Path(path).name}", unit="tensor",
              disable=total < _PROGRESS_MIN_TENSORS) as bar:
        for f in files:
            with safe_open(str(f), framework="pt", device=device) as reader:
                for name in names[f]:
                    yield name, reader.get_tensor(name)
                    bar.update(1)


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The whole checkpoint at `path` as a dict (small checkpoints, tests)."""
    return dict(iter_safetensors(path))
