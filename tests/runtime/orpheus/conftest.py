"""Run these tiny-model tests on one intra-op thread.

On the shared 2-core CI machines, torch's second intra-op thread makes small kernels
wait on a busy core: a tiny rollout took 9.5 s on 2 threads vs 0.26 s on 1 under load.
"""
from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
