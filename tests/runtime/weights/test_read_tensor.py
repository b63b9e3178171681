"""Tensors read from safetensors files a tensor at a time: the same values as the safetensors library gives, and
only the tensor in flight is mapped (a whole mapped checkpoint counts in the resident set: two copies at start-up)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.model_executor.weights import iter_safetensors
from runtime.model_executor.weights.headers import read_header, read_tensor


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16), "f32": torch.randn(7, generator=g),
            "f16": torch.randn(2, 2, 2, generator=g).to(torch.float16), "i64": torch.arange(6).reshape(2, 3),
            "u8": torch.arange(5, dtype=torch.uint8), "flag": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4)}


def test_every_tensor_reads_as_the_safetensors_library_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_tensors(), str(path))
    expected = load_file(str(path))
    with path.open("rb") as f:
        got = {name: read_tensor(f, info) for name, info in read_header(path).items()}
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape and torch.equal(got[name], tensor)


def _mapped_bytes(path: Path) -> list[int]:
    """The size of every mapping of `path` in this process."""
    sizes = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path.resolve())):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            sizes.append(hi - lo)
    return sizes


def test_only_the_tensor_in_flight_is_mapped_and_nothing_after(tmp_path: Path) -> None:
    big = {f"w{i}": torch.full((256, 1024), float(i)) for i in range(4)}     # 1 MiB each, 4 MiB in all
    path = tmp_path / "model.safetensors"
    save_file(big, str(path))
    seen = []
    for name, tensor in iter_safetensors(tmp_path):
        assert torch.equal(tensor, big[name])
        sizes = _mapped_bytes(path)
        assert len(sizes) == 1 and sizes[0] <= 2**20 + 2 * 4096, f"{sizes} mapped while {name} is read"
        seen.append(name)
        del tensor      # as a loader drops each tensor before the next (runtime.model_executor.weights.load_into)
    assert sorted(seen) == sorted(big) and _mapped_bytes(path) == []


def test_a_truncated_file_and_an_unknown_dtype_are_named(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(64)}, str(path))
    info = read_header(path)["w"]
    path.write_bytes(path.read_bytes()[:-10])
    with path.open("rb") as f, pytest.raises(ValueError, match="ends 10 bytes into a tensor of 256"):
        read_tensor(f, info)
    odd = type(info)(info.file, "C64", info.shape, info.nbytes, info.offset)
    with path.open("rb") as f, pytest.raises(ValueError, match="dtype C64 is not one mstar reads"):
        read_tensor(f, odd)
