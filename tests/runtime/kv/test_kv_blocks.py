"""Block allocator and block tables: no leaks, exact reference counts, atomic failure, copy-on-write."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from tests.runtime.models.decoder_lm.lm_factories import PagedRunner, build, tiny_dims
from runtime.model_executor.kv import BlockAllocator, KVBlockManager, OutOfBlocks


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
        # a branch's rows come from 1-row decode steps batched three ways, the fresh run's from one 12-row prefill:
        # other GEMM blockings, fp32 order differences of a few ulps (eps 1.2e-7) on logits |l| <= 0.62; measured max
        # 1.5e-7, 1.5% of the bound
        torch.testing.assert_close(torch.stack(got[name]), alone[len(prompt):], atol=1e-5, rtol=0)


def _runs(blocks: list[int]) -> int:
    """How many stretches of consecutive block ids a table is made of."""
    return 1 + sum(1 for a, b in zip(blocks, blocks[1:]) if b != a + 1)


def _decode_side_by_side(manager: KVBlockManager, first: int, steps: int, rng: random.Random,
                         prefix: bool) -> list[str]:
    """16 requests with prompts of 1-5 blocks, then growing a token each in turn, as a decode batch does."""
    reqs = [f"r{first + i}" for i in range(16)]
    for req in reqs:
        n = rng.randint(16, 80)
        manager.allocate(req, n, [rng.randrange(1 << 20) for _ in range(n)] if prefix else None)
        manager.commit(req)
    for _ in range(steps):
        for req in reqs:
            manager.append(req, 1, [rng.randrange(1 << 20)] if prefix else None)
            manager.commit(req)
    return reqs


@pytest.mark.parametrize("prefix", [False, True])
def test_requests_growing_side_by_side_get_their_blocks_in_runs(prefix: bool) -> None:
    """Decodes that grow a block each in turn would interleave their blocks one by one if each took the next
    free one; runs keep each table in stretches of consecutive blocks (what the CPU attention reads fastest),
    on a fresh pool, and again from blocks freed by earlier requests (tail first; with the prefix cache from
    cached blocks evicted), with no block held back: the pool still fills to its last block."""
    from runtime.model_executor.kv.prefix_cache import prefix_root
    rng = random.Random(3)
    manager = KVBlockManager(num_blocks=400, block_size=16, prefix_root=prefix_root("runs") if prefix else None)
    first = _decode_side_by_side(manager, 0, 150, rng, prefix)    # up to 5 + 10 blocks each, 16 at most
    assert all(_runs(manager.table(r).blocks) == 1 for r in first), [manager.table(r).blocks for r in first]
    for req in first:
        manager.free(req)
    second = _decode_side_by_side(manager, 16, 150, rng, prefix)  # 240 blocks were used: some come back
    blocks = sum(len(manager.table(r).blocks) for r in second)
    assert sum(_runs(manager.table(r).blocks) for r in second) <= blocks / 3, [manager.table(r).blocks for r in second]
    rest = manager.allocator.num_free
    manager.allocate("fill", rest * 16)                          # every block left, kept neighbours included
    assert manager.allocator.num_free == 0
