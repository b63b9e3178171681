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
    return subprocess.run([sys.executable, "-m", "runtime.cli", "convert-weights", str(directory)], cwd=REPO,
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
    assert f"{tmp_path / 'pytorch_model.bin'}: not converted, torch.load(weights_only=True) refuses it" in out.stdout
    assert not (tmp_path / "pytorch_model.safetensors").exists()
