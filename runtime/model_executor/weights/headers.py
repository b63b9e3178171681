"""Safetensors headers without the data (names, dtypes, shapes, byte ranges), and tensors read one at a time.

A safetensors file starts with an 8-byte little-endian header length and that many bytes
of JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {...}}). Reading only that
takes milliseconds for any file size and maps nothing (`safe_open` maps the whole file,
which fails on a 29 GB checkpoint with less memory than that), so `check-weights` and the
start-up checks use it.

`read_tensor` maps one tensor's bytes, and only those: the mapping lives as long as the
tensor does. The pages of a mapped file count in the process' resident set while they are
mapped, so a whole checkpoint mapped while it is copied into packed weights (`safe_open`)
peaks at two copies of the model; mapped a tensor at a time, the process holds one copy plus
the tensor in flight, and the file's pages stay in the page cache (the kernel's to reclaim,
warm for the next start). Nothing is read twice: the loader's copy reads the mapped pages.
"""
from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

# larger headers are not safetensors files (the format caps them at 100 MB)
_MAX_HEADER_BYTES = 100 * 2**20


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint file, as its header describes it."""

    file: Path
    dtype: str                  # safetensors dtype name: "BF16", "F32", ...
    shape: tuple[int, ...]
    nbytes: int
    offset: int = -1            # where its bytes start in the file (-1: not known, e.g. a layout without data)


DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def _header_json(path: Path) -> tuple[int, dict]:
    """The header's length and its JSON."""
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", prefix)
        if length > _MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a safetensors file (header length {length})")
        try:
            return length, json.loads(f.read(length))
        except ValueError as exc:
            raise ValueError(f"{path}: unreadable safetensors header: {exc}") from None


def read_header(path: str | Path) -> dict[str, TensorInfo]:
    """name -> TensorInfo for every tensor of the safetensors file at `path`."""
    path = Path(path)
    length, header = _header_json(path)
    return {name: TensorInfo(path, entry["dtype"], tuple(entry["shape"]),
                             entry["data_offsets"][1] - entry["data_offsets"][0], 8 + length + entry["data_offsets"][0])
            for name, entry in header.items() if name != "__metadata__"}


def read_metadata(path: str | Path) -> dict[str, str]:
    """The file's `__metadata__` (string -> string; empty when it has none)."""
    return dict(_header_json(Path(path))[1].get("__metadata__") or {})


def read_tensor(f: BinaryIO, info: TensorInfo) -> torch.Tensor:
    """The tensor `info` describes, from `f` (its file, opened for binary reading): a copy-on-write mapping of
    its bytes alone, unmapped when the tensor is freed (module docstring)."""
    dtype = DTYPES.get(info.dtype)
    if dtype is None:
        raise ValueError(f"{info.file}: dtype {info.dtype} is not one mstar reads ({', '.join(DTYPES)})")
    if info.offset < 0:
        raise ValueError(f"{info.file}: where the tensor's bytes start is not known")
    numel = 1
    for size in info.shape:
        numel *= size
    if info.nbytes != numel * dtype.itemsize:
        raise ValueError(f"{info.file}: {info.nbytes} bytes for a {info.dtype} tensor of shape {list(info.shape)}")
    if not info.nbytes:
        return torch.empty(info.shape, dtype=dtype)
    size = f.seek(0, 2)
    if info.offset + info.nbytes > size:
        raise ValueError(f"{info.file}: ends {info.offset + info.nbytes - size} bytes into a tensor of {info.nbytes}")
    skip = info.offset % mmap.ALLOCATIONGRANULARITY
    region = mmap.mmap(f.fileno(), skip + info.nbytes, offset=info.offset - skip, access=mmap.ACCESS_COPY)
    raw = torch.frombuffer(region, dtype=torch.uint8, count=info.nbytes, offset=skip)
    return raw.view(dtype).reshape(info.shape)
