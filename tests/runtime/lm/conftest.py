"""LM tests run tiny models: one intra-op thread each (restored afterwards).

With tensors this small a second OpenMP thread adds no speed, and on a shared 2-core
machine its spin-waiting made these tests several times slower.
"""
from __future__ import annotations

from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
