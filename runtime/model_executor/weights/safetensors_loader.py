"""Reading HF safetensors checkpoints: one file or a directory of shards, lazily, with progress.

`iter_safetensors(path)` yields (name, tensor) one tensor at a time so a model can load a
checkpoint larger than what it keeps (tensor-parallel shards); a tqdm bar counts tensors
when there are many. Never pickle: safetensors only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch
from tqdm import tqdm

from runtime.model_executor.weights.headers import read_header, read_tensor

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
    """Every (name, tensor) of the checkpoint at `path`, one at a time (each mapped alone while it lives:
    headers.read_tensor)."""
    headers = {f: read_header(f) for f in checkpoint_files(path)}
    total = sum(len(infos) for infos in headers.values())
    with tqdm(total=total, desc=f"loading {Path(path).name}", unit="tensor",
              disable=total < _PROGRESS_MIN_TENSORS) as bar:
        for path_of, infos in headers.items():
            with path_of.open("rb", buffering=0) as f:
                for name, info in infos.items():
                    tensor = read_tensor(f, info)
                    yield name, tensor if device == "cpu" else tensor.to(device)
                    bar.update(1)


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The whole checkpoint at `path` as a dict (small checkpoints, tests)."""
    return dict(iter_safetensors(path))
