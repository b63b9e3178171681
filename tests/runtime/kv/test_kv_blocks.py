"""Block allocator and block tables: no leaks, exact reference counts, atomic failure, copy-on-write."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from tests.runtime.models.decoder_lm.lm_factories import PagedRunner, build, tiny_dims
from runtime.kv import BlockAllocator, KVBlockManager, OutOfBlocks


def _check_invariants(manager: KVBlockManager, live: set) -> None:
    owners = Counter(b for req in live for b in manager.table(req).blocks)
    alloc = manager.allocator
    for block in range(alloc.num_blocks):
        assert alloc.ref_count(block) == owners.get(block, 0), f"block {block}"
    assert alloc.num_free == alloc.num_blocks - len(owners)
    for req in live:
        table = manager.table(req)
        assert len(table.blocks) == -(-table.num_tokens // manager.block_size)


def _snapshot(manager: KVBlockManager, live: set) -> tuple:
    return (manager.allocator.num_free, {r: (list(manager.table(r).blocks), manager.num_tokens(r)) for r in live})


def test_random_allocate_append_fork_free_returns_every_block() -> None:
    rng = random.Random(0)
    manager = KVBlockManager(num_blocks=48, block_size=4)
    live: set[int] = set()
    next_id, failures, copies = 0, 0, 0
    for _ in range(5000):
        op = rng.choices(["allocate", "append", "fork", "free"], weights=[2, 4, 2, 3])[0]
        before = _snapshot(manager, live)
        try:
            if op == "allocate":
                n = rng.randint(0, 20)
                assert manager.can_allocate(n) == (-(-n // 4) <= manager.allocator.num_free)
                manager.allocate(next_id, n)
                live.add(next_id)
                next_id += 1
            elif op == "append" and live:
                req, n = rng.choice(sorted(live)), rng.randint(1, 6)
                expect_ok = manager.can_append(req, n)
                copies += len(manager.append(req, n))
                assert expect_ok
            elif op == "fork" and live:
                manager.fork(rng.choice(sorted(live)), next_id)
                live.add(next_id)
                next_id += 1
            elif op == "free" and live:
                req = rng.choice(sorted(live))
                manager.free(req)
                live.remove(req)
        except OutOfBlocks:
            failures += 1
            assert _snapshot(manager, live) == before, "a failed call changed state"
        _check_invariants(manager, live)
    for req in sorted(live):
        manager.free(req)
    assert manager.allocator.num_free == 48
    assert all(manager.allocator.ref_count(b) == 0 for b in range(48))
    assert failures > 50 and copies > 50, "the sequence never exercised exhaustion or copy-on-write"


def test_allocator_rejects_double_free_and_sharing_free_blocks() -> None:
    alloc = BlockAllocator(4)
    blocks = alloc.allocate(2)
    alloc.free(blocks)
    with pytest.raises(ValueError, match="freed twice"):
        alloc.free(blocks[:1])
    with pytest.raises(ValueError, match="free"):
        alloc.share(blocks[:1])
    with pytest.raises(OutOfBlocks) as info:
        alloc.allocate(5)
    assert info.value.needed == 5 and info.value.free == 4


@torch.no_grad()
def test_forked_requests_share_the_prompt_and_diverge_exactly() -> None:
    """A prompt that ends mid-block, forked three ways: each branch equals a fresh run of its own tokens."""
    dims = tiny_dims("llama_lm")
    model = build("llama_lm", dims)
    prompt, branches = list(range(10, 17)), {"a": [1, 2, 3, 4, 5], "b": [6, 7, 8, 9, 10], "c": [11, 12, 13, 14, 15]}
    runner = PagedRunner(model, num_blocks=32, block_size=4)
    runner.step([("a", prompt)])
    shared_free = runner.manager.allocator.num_free
    runner.manager.fork("a", "b")
    runner.manager.fork("a", "c")
    assert runner.manager.allocator.num_free == shared_free, "fork must not copy blocks"
    got = {name: [] for name in branches}
    for i in range(5):
        for name, logits in zip(branches, runner.step([(n, [t[i]]) for n, t in branches.items()])):
            got[name].append(logits[0])
    for name, tokens in branches.items():
        alone = PagedRunner(model, num_blocks=32, block_size=4).step([(name, prompt + tokens)])[0]
        torch.testing.assert_close(torch.stack(got[name]), alone[len(prompt):], atol=1e-5, rtol=0)
