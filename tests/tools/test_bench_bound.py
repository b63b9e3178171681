"""The bound suite's two measurements: weight bytes (a tied weight once) and read bandwidth."""
from __future__ import annotations

import torch
from torch import nn

from bench.suite_bound import read_bandwidth, weight_bytes


def test_weight_bytes_count_a_tied_weight_once_and_every_dtype_at_its_size() -> None:
    embed, head = nn.Embedding(100, 8), nn.Linear(8, 100, bias=False)
    head.weight = embed.weight                                     # tied, as SmolLM2's LM head
    model = nn.ModuleDict({"embed": embed, "head": head, "norm": nn.LayerNorm(8)}).to(torch.bfloat16)
    assert weight_bytes(model) == (100 * 8 + 8 + 8) * 2


def test_read_bandwidth_is_bytes_over_the_median_sum_time() -> None:
    buffer = torch.ones(1 << 20)
    assert 1e8 < read_bandwidth(buffer) < 1e13                     # 4 MiB read: between 0.1 GB/s and 10 TB/s
