"""`mstar-run convert-weights DIR`: pickles to safetensors once, tensors only, through the real CLI."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.runtime.serving.conftest import REPO


def convert(directory: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "convert-weights", str(directory)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_nested_state_dicts_become_dotted_names_and_reruns_leave_them(tmp_path: Path) -> None:
    weight = torch.randn(4, 3)
    torch.save({"encoder": {"module.w": weight, "module.b": torch.zeros(4)}, "epoch": 3}, tmp_path / "ckpt.pt")
    out = convert(tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"{tmp_path / 'ckpt.pt'} -> {tmp_path / 'ckpt.safetensors'}: 2 tensors (skipped 1 non-tensor entries: epoch)" \
        in out.stdout
    tensors = load_file(str(tmp_path / "ckpt.safetensors"))
    assert set(tensors) == {"encoder.module.w", "encoder.module.b"} and torch.equal(tensors["encoder.module.w"], weight)
    again = convert(tmp_path)
    assert again.returncode == 0 and "exists, left as is" in again.stdout


def test_a_pickle_with_code_is_refused(tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(2), "extra": argparse.Namespace(run="code")}, tmp_path / "pytorch_model.bin")
    out = convert(tmp_path)
    assert out.returncode == 1
    assert (f"{tmp_path / 'pytorch_model.bin'}: not converted, not a checkpoint of tensors: it names "
            "argparse.Namespace") in out.stdout
    assert not (tmp_path / "pytorch_model.safetensors").exists()


def test_the_reader_gives_back_what_torch_save_wrote_without_unpickling(tmp_path: Path) -> None:
    """runtime/model_executor/weights/torch_zip.py against torch.save itself: every storage dtype a checkpoint uses,
    strided views sharing a storage, parameters, an OrderedDict with metadata, lists, numbers, None."""
    from collections import OrderedDict

    from runtime.model_executor.weights.torch_zip import read_torch_zip
    base = torch.arange(24, dtype=torch.float32).view(4, 6)
    state = OrderedDict(w=torch.randn(3, 5), view=base.t()[1:, ::2], same=base,
                        p=torch.nn.Parameter(torch.ones(2, dtype=torch.float16)), empty=torch.zeros(0))
    state._metadata = {"": {"version": 1}}
    dtypes = {str(d): torch.ones(3, dtype=d) for d in (torch.float64, torch.bfloat16, torch.int64, torch.int32,
                                                       torch.int16, torch.int8, torch.uint8, torch.bool)}
    saved = {"model": state, "dtypes": dtypes, "epoch": 12345678901, "lr": 0.25, "names": ["a", "b"], "none": None}
    torch.save(saved, tmp_path / "ckpt.pt")
    got = read_torch_zip(tmp_path / "ckpt.pt")
    assert set(got) == set(saved) and got["epoch"] == 12345678901 and got["lr"] == 0.25
    assert got["names"] == ["a", "b"] and got["none"] is None
    for key, t in [*state.items(), *dtypes.items()]:
        mine = got["model"].get(key, got["dtypes"].get(key))
        assert mine.dtype == t.dtype and mine.shape == t.shape and torch.equal(mine, t.detach()), key


def test_the_reader_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    import pytest

    from runtime.model_executor.weights.torch_zip import NotAWeightsFile, read_torch_zip
    (tmp_path / "junk.bin").write_bytes(b"not a zip")
    with pytest.raises(NotAWeightsFile, match="not a zip"):
        read_torch_zip(tmp_path / "junk.bin")
    torch.save({"f": print}, tmp_path / "code.pt")
    with pytest.raises(NotAWeightsFile, match=r"names __builtin__\.print"):
        read_torch_zip(tmp_path / "code.pt")
