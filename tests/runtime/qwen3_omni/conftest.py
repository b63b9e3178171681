"""Qwen3-Omni component tests run single-threaded.

These tiny models do many small ops; on a shared 2-core machine intra-op threads only
contend (a code2wav decode took 12 ms on one thread and 0.2-2 s on two). The previous
thread count is restored after each test so other directories are unaffected.
"""
from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
