"""Suite-wide set-up.

Triton kernels run on CPU tensors through the interpreter, which must be switched on
before any kernel module is imported; on a machine with a CUDA device they compile for
real. Tests marked `gpu` are skipped without a CUDA device.
"""
from __future__ import annotations

import os

import pytest

HAS_CUDA_DEVICE = os.path.exists("/dev/nvidiactl")

if not HAS_CUDA_DEVICE:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA_DEVICE:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
