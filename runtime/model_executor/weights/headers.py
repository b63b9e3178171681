"""Safetensors headers without the data: names, dtypes, shapes, byte sizes.

A safetensors file starts with an 8-byte little-endian header length and that many bytes
of JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {...}}). Reading only that
takes milliseconds for any file size and maps nothing (`safe_open` maps the whole file,
which fails on a 29 GB checkpoint with less memory than that), so `check-weights` and the
start-up checks use it.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

# larger headers are not safetensors files (the format caps them at 100 MB)
_MAX_HEADER_BYTES = 100 * 2**20


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint file, as its header describes it."""

    file: Path
    dtype: str                  # safetensors dtype name: "BF16", "F32", ...
    shape: tuple[int, ...]
    nbytes: int


def read_header(path: str | Path) -> dict[str, TensorInfo]:
    """name -> TensorInfo for every tensor of the safetensors file at `path`."""
    path = Path(path)
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a safetensors file (header length {length})")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise ValueError(f"{path}: unreadable safetensors header: {exc}") from None
    return {name: TensorInfo(path, entry["dtype"], tuple(entry["shape"]),
                             entry["data_offsets"][1] - entry["data_offsets"][0])
            for name, entry in header.items() if name != "__metadata__"}
