"""Run this directory's tests on one intra-op thread.

On a shared 2-core machine torch's second OpenMP thread spin-waits for a core: a tiny
matmul then takes ~50 ms instead of ~5 us. These tests use tiny tensors, so one
thread is both faster and steadier; the setting is restored after each module.
"""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_intra_op_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
