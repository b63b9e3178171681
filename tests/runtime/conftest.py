"""Runtime tests run torch on one intra-op thread.

The components under test are tiny; on a 2-core machine that also runs worker
processes, torch's second OpenMP thread spin-waits for a busy core and a tiny matmul
takes ~50 ms instead of microseconds (a tiny code2wav decode: 12 ms on one thread,
0.2-2 s on two). The previous setting is restored after each module. Benchmarks in
tools/ choose their own thread counts.
"""
from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_intra_op_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
