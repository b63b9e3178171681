"""Content-addressed KV blocks: reuse of the longest cached chain, LRU eviction of unowned blocks
only, and a randomised run of allocate / reuse / decode / evict / abort that checks the
reference counts, that no held block is ever evicted, and that a reused block holds exactly
the tokens its key names (a block of an aborted prefill is never reachable)."""
from __future__ import annotations

import random

import pytest

from runtime.conductor.kv_ledger import KVPoolLedger
from runtime.model_executor.kv import KVBlockManager, OutOfBlocks, prefix_root

BS = 4
ROOT = prefix_root("test-model", "lm", "fp32")


def prefill(kv: KVBlockManager, req: int, tokens: list[int]) -> int:
    """Allocate a new request reusing what is cached, 'run' it, commit; the tokens reused."""
    hit = kv.prefix_hit(tokens)
    kv.allocate(req, len(tokens), tokens, reuse=hit)
    kv.commit(req)
    return hit


def test_a_second_request_reuses_the_shared_full_blocks_and_computes_the_rest() -> None:
    kv = KVBlockManager(16, BS, ROOT)
    system = list(range(100, 110))                      # 2 full blocks + 2 tokens
    assert prefill(kv, 1, system + [1, 2, 3]) == 0
    assert kv.prefix_hit(system + [7, 8, 9]) == 8       # only full blocks are shared
    assert prefill(kv, 2, system + [7, 8, 9]) == 8
    assert kv.table(2).blocks[:2] == kv.table(1).blocks[:2]
    assert kv.table(2).blocks[2:] != kv.table(1).blocks[2:]
    assert [kv.allocator.ref_count(b) for b in kv.table(1).blocks[:2]] == [2, 2]


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    kv = KVBlockManager(16, BS, ROOT)
    prompt = list(range(8))                             # exactly 2 blocks
    prefill(kv, 1, prompt)
    assert kv.prefix_hit(prompt) == 4                   # the second block is recomputed for the logits
    assert kv.prefix_hit(prompt + [9]) == 8


def test_other_model_identity_shares_nothing() -> None:
    a, b = KVBlockManager(8, BS, ROOT), KVBlockManager(8, BS, prefix_root("other-model", "lm", "fp32"))
    tokens = list(range(12))
    prefill(a, 1, tokens)
    assert a.prefix_hit(tokens) == 8
    assert b.prefix_hit(tokens) == 0


def test_freed_cached_blocks_stay_findable_until_free_blocks_run_out_then_lru_goes_first() -> None:
    kv = KVBlockManager(6, BS, ROOT)
    old, new = [1] * 8 + [0], [2] * 8 + [0]
    prefill(kv, 1, old)
    kv.free(1)
    prefill(kv, 2, new)
    kv.free(2)
    assert kv.allocator.num_free == 6 and kv.allocator.num_cached == 4
    assert kv.prefix_hit(old + [5]) == 8 and kv.prefix_hit(new + [5]) == 8
    kv.allocate(3, 4 * BS)                              # 2 truly free blocks, then 2 evictions
    assert kv.allocator.stats.evictions == 2
    assert kv.prefix_hit(old + [5]) == 0                # the least recently freed chain went first
    assert kv.prefix_hit(new + [5]) == 8


def test_a_held_block_is_never_evicted_and_running_out_changes_nothing() -> None:
    kv = KVBlockManager(4, BS, ROOT)
    prefill(kv, 1, list(range(9)))                      # 3 blocks held
    with pytest.raises(OutOfBlocks):
        kv.allocate(2, 2 * BS)
    assert kv.allocator.num_free == 1 and kv.prefix_hit(list(range(9))) == 8


def test_reusing_more_than_is_cached_is_a_loud_error() -> None:
    kv = KVBlockManager(8, BS, ROOT)
    with pytest.raises(ValueError, match="asked to reuse 8 cached tokens, but this KV cache holds 0"):
        kv.allocate(1, 9, list(range(9)), reuse=8)
    assert 1 not in kv and kv.allocator.num_free == 8


def test_decode_tokens_fill_blocks_that_a_later_turn_reuses() -> None:
    kv = KVBlockManager(8, BS, ROOT)
    turn1 = [5, 6, 7]
    prefill(kv, 1, turn1)
    for token in (8, 9, 10, 11, 12):                    # the answer, one decode step at a time
        kv.append(1, 1, [token])
        kv.commit(1)
    kv.free(1)
    assert kv.prefix_hit(turn1 + [8, 9, 10, 11, 12, 13, 14]) == 8


class _Count:
    """Tokens per request, each its own ceil(tokens / BS) blocks, nothing shared: what a pool that
    does not know the worker's reuse would count (an upper bound on what the cache holds)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks, self.tokens = num_blocks, {}

    @property
    def used_blocks(self) -> int:
        return sum(-(-n // BS) for n in self.tokens.values())

    def can_grow(self, req: int, n: int) -> bool:
        held = self.tokens.get(req, 0)
        return -(-(held + n) // BS) + held // -BS <= self.num_blocks - self.used_blocks

    def grow(self, req: int, n: int) -> None:
        self.tokens[req] = self.tokens.get(req, 0) + n

    def free(self, req: int) -> None:
        self.tokens.pop(req, None)


def test_randomised_allocate_reuse_decode_evict_abort_keeps_every_invariant() -> None:
    """Also prompts prefilled in two chunks (the second looked up after the first, which may end
    mid-block), and a plain ledger fed the same calls: what it admits always fits the cache (the
    count of a node that decides reuse on its worker)."""
    rng = random.Random(1234)
    kv = KVBlockManager(24, BS, ROOT)
    ledger = KVPoolLedger(24, BS, ROOT)                 # the conductor's tables, fed the same calls
    plain = _Count(24)                                  # a count that shares nothing: an upper bound
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(4, 14))] for _ in range(5)]
    written: dict[int, tuple[int, ...]] = {}            # block -> the tokens its KV was computed from
    live: dict[int, list[int]] = {}                     # request -> its tokens so far
    todo: dict[int, list[int]] = {}                     # request -> its prompt's second chunk
    next_id = 0
    for _ in range(4000):
        op = rng.random()
        if op < 0.35 or not live:
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 7))]
            rest = tokens[rng.randrange(1, len(tokens)):] if rng.random() < 0.3 else []
            tokens = tokens[:len(tokens) - len(rest)]
            hit = kv.prefix_hit(tokens)
            if not kv.can_allocate(len(tokens), tokens, hit):
                assert not ledger.can_grow(next_id, len(tokens), tokens=tokens)
                assert not plain.can_grow(next_id, len(tokens))
                continue
            assert ledger.can_grow(next_id, len(tokens), tokens=tokens)
            held_before = {b for t in live for b in kv.table(t).blocks}
            kv.allocate(next_id, len(tokens), tokens, reuse=hit)
            assert ledger.grow(next_id, len(tokens), tokens=tokens) == hit
            blocks = kv.table(next_id).blocks
            for i, b in enumerate(blocks[:hit // BS]):     # reused: exactly the tokens the key names
                assert written[b] == tuple(tokens[i * BS:(i + 1) * BS])
            fresh = blocks[hit // BS:]
            assert not held_before & set(fresh), "a block some request holds was handed out again"
            if rng.random() < 0.15:                        # aborted mid-prefill: half-written, never committed
                for b in fresh:
                    written[b] = ("garbage",)
                kv.free(next_id)
                ledger.commit()                            # the pass ended before the batch failed
                ledger.forget([next_id])
                ledger.free(next_id)
            else:
                plain.grow(next_id, len(tokens))
                for i, b in enumerate(blocks):
                    if i >= hit // BS:
                        written[b] = tuple(tokens[i * BS:(i + 1) * BS])
                kv.commit(next_id)
                ledger.commit()
                live[next_id] = list(tokens)
                if rest:
                    todo[next_id] = rest
            next_id += 1
        elif op < 0.5 and todo:
            req = rng.choice(list(todo))
            _second_chunk(kv, ledger, plain, req, todo, live, written)
        elif op < 0.8:
            req = rng.choice(list(live))
            if not kv.can_append(req, 1):
                assert not plain.can_grow(req, 1)
                continue
            token = rng.randrange(50)
            kv.append(req, 1, [token])
            ledger.grow(req, 1, tokens=[token])
            plain.grow(req, 1)
            live[req].append(token)
            todo.pop(req, None)                            # a decode step: the prompt is over
            n = len(live[req])
            b = kv.table(req).blocks[(n - 1) // BS]
            written[b] = tuple(live[req][(n - 1) // BS * BS:n])
            kv.commit(req)
            ledger.commit()
        else:
            req = rng.choice(list(live))
            kv.free(req)
            ledger.free(req)
            plain.free(req)
            del live[req]
            todo.pop(req, None)
        owners: dict[int, int] = {}
        for req in live:
            for b in kv.table(req).blocks:
                owners[b] = owners.get(b, 0) + 1
        assert all(kv.allocator.ref_count(b) == owners.get(b, 0) for b in range(24)), "reference counts drifted"
        assert kv.allocator.num_free == 24 - len(owners)
        assert ledger.used_blocks == len(owners) <= plain.used_blocks
    for req in list(live):
        kv.free(req)
    assert kv.allocator.num_free == 24 and kv.allocator.stats.evictions > 0 and kv.allocator.stats.hits > 0


def _second_chunk(kv: KVBlockManager, ledger: KVPoolLedger, plain: _Count, req: int,
                  todo: dict[int, list[int]], live: dict[int, list[int]], written: dict) -> None:
    """The rest of `req`'s prompt, continuing in cached blocks where they hold it (the randomised test)."""
    rest = todo[req]
    start, hit = len(live[req]), kv.prefix_hit(rest, after=req)
    try:
        kv.append(req, len(rest), rest, reuse=hit)
    except OutOfBlocks:
        assert not plain.can_grow(req, len(rest)), "the plain count admitted what the cache cannot hold"
        return
    assert ledger.grow(req, len(rest), tokens=rest) == hit
    plain.grow(req, len(rest))
    full = live[req] + rest
    blocks = kv.table(req).blocks
    for i in range(start // BS, (start + hit) // BS):  # reused, the partly filled block's rows included
        assert written[blocks[i]] == tuple(full[i * BS:(i + 1) * BS])
    for i in range((start + hit) // BS, len(blocks)):
        written[blocks[i]] = tuple(full[i * BS:(i + 1) * BS])
    kv.commit(req)
    ledger.commit()
    live[req] = full
    del todo[req]


def test_a_later_prompt_chunk_continues_in_cached_blocks() -> None:
    """Chunked prefill: B's first chunk was computed before A's prompt was cached; B's next chunk
    looks up again, continuing B's chain, and shares A's blocks (the conductor's tables and a worker's own alike)."""
    kv = KVBlockManager(16, BS, ROOT)
    prompt = list(range(200, 216))                       # 4 full blocks
    kv.allocate("b", 4, prompt[:4], reuse=0)
    kv.commit("b")                                       # B's first chunk: 1 block, computed
    assert prefill(kv, "a", prompt) == 4                 # A reuses it and computes the rest
    hit = kv.prefix_hit(prompt[4:], after="b")
    assert hit == 8                                      # 2 of the 3 remaining blocks: the last computes
    kv.append("b", 12, prompt[4:], reuse=hit)
    assert kv.table("b").blocks[:3] == kv.table("a").blocks[:3]
    kv.commit("b")
    assert kv.allocator.stats.queries == 3 and kv.allocator.stats.hit_tokens == 4 + 8
    with pytest.raises(ValueError, match="asked to reuse"):                 # nothing follows B's last block in the cache
        kv.append("b", 8, list(range(300, 308)), reuse=4)
    kv.append("b", 1, [5])                               # decode steps look up nothing
    assert kv.allocator.stats.queries == 3
    kv.free("a")
    kv.free("b")
    assert kv.allocator.num_free == 16


def test_a_chunk_after_a_partly_filled_block_continues_in_the_cached_block_holding_its_rows() -> None:
    """B's first chunk ends mid-block; its next chunk's lookup chains over the partly filled block's
    rows too, and the cached block holding them (and more) replaces B's own, which is freed."""
    kv = KVBlockManager(16, BS, ROOT)
    prompt = list(range(200, 216))
    prefill(kv, "a", prompt)
    kv.allocate("b", 6, prompt[:6], reuse=4)             # ends mid-block: rows 4, 5 in a block of its own
    kv.commit("b")
    own = kv.table("b").blocks[1]
    free = kv.allocator.num_free
    assert kv.prefix_hit(prompt[6:], after="b") == 6     # blocks 2 and 3 of A: rows 6..11; 12.. compute
    assert kv.prefix_hit(prompt[6:], after="b", limit=5) == 2    # none at or past row `limit`: one block
    kv.append("b", 10, prompt[6:], reuse=6)
    assert kv.table("b").blocks[:3] == kv.table("a").blocks[:3] and kv.table("b").blocks[1] != own
    # own freed, one fresh block taken for rows 12..15 (the allocator may hand own back as that one)
    assert len(kv.table("b").blocks) == 4 and kv.allocator.num_free == free
    kv.commit("b")
    assert len(kv.table("b").keys) == 4 and kv.table("b").keys == kv.table("a").keys
    with pytest.raises(ValueError, match="asked to reuse"):                 # a reuse not ending on a block boundary
        kv.allocate("c", 6, prompt[:6], reuse=4)
        kv.commit("c")
        kv.append("c", 10, prompt[6:], reuse=5)
    kv.free("a")
    kv.free("b")
    kv.free("c")
    assert kv.allocator.num_free == 16


def test_the_ledger_reuses_later_chunks_like_a_worker_deciding_itself() -> None:
    pool = KVPoolLedger(16, BS, ROOT)
    worker = KVBlockManager(16, BS, ROOT)
    prompt = list(range(400, 416))
    for kv in (pool.tables, worker):
        prefill(kv, "a", prompt)
    chunks = [prompt[:8], prompt[8:]]
    assert pool.cached_prefix("b", prompt) == 12         # a Run of the whole rest would reuse 3 blocks
    reuse = [pool.grow("b", len(chunks[0]), tokens=chunks[0])]
    pool.commit()
    reuse.append(pool.grow("b", len(chunks[1]), tokens=chunks[1]))
    assert reuse == [4, 4]                               # each chunk leaves its last block to compute
    worker.allocate("b", 8, chunks[0], reuse=reuse[0])
    worker.commit("b")
    worker.append("b", 8, chunks[1], reuse=reuse[1])     # what the conductor counted is there
    assert len(worker.table("b").blocks) == len(pool.tables.table("b").blocks) == 4


def test_a_piece_holding_a_placeholder_is_neither_looked_up_nor_cached() -> None:
    """Placeholder ids (an encoder's rows go there) stop caching, in the worker's cache and the
    conductor's tables alike: the text before them is reused, nothing from them on."""
    pad = 99
    kv = KVBlockManager(16, BS, ROOT, frozenset({pad}))
    ledger = KVPoolLedger(16, BS, ROOT, frozenset({pad}))
    text, picture = list(range(10)), [pad] * 6 + [7, 8, 9, 10, 11]
    for cache in (kv, ledger.tables):
        prefill(cache, 1, text)
        assert cache.prefix_hit(text + [50]) == 8
        assert cache.prefix_hit(picture) == 0 and cache.prefix_hit(text[:8] + picture) == 0
        cache.allocate(2, len(text[:8] + picture), text[:8] + picture)
        cache.commit(2)
        cache.free(2)
    assert ledger.cached_prefix(3, text[:8] + picture) == 0 and kv.allocator.num_cached == 2


@pytest.mark.parametrize("root", [ROOT, None])
def test_a_row_appended_the_short_way_leaves_what_the_general_append_leaves(monkeypatch: pytest.MonkeyPatch,
                                                                             root) -> None:
    """`append` of one row takes a short way (`append_row`: into the request's own partly filled last
    block, every decode step's usual case, or into one fresh block after a full one); driven by the
    same random calls (forks that share a last block, rows unknown or holding a placeholder, commits,
    frees), a manager that always takes the general way ends every call in the same state and returns
    the same copies."""
    def drive(short: bool) -> tuple[list, int, int]:
        rng = random.Random(11)
        kv = KVBlockManager(40, BS, root, stop_ids=frozenset({49}))
        if not short:
            monkeypatch.setattr(kv, "append_row", lambda req, tokens: False)
        trace, live, short_ways, fresh_ways, next_id = [], [], 0, 0, 0
        for _ in range(3000):
            op = rng.random()
            if op < 0.15 or not live:
                tokens = [rng.randrange(50) for _ in range(rng.randrange(1, 11))]
                if not kv.can_allocate(len(tokens), tokens):
                    continue
                kv.allocate(next_id, len(tokens), tokens)
                out: object = "allocated"
                live.append(next_id)
                next_id += 1
            elif op < 0.22:
                kv.fork(rng.choice(live), next_id)          # a shared, maybe partly filled, last block
                out = "forked"
                live.append(next_id)
                next_id += 1
            elif op < 0.8:
                req = rng.choice(live)
                if not kv.can_append(req, 1):
                    continue
                table = kv.table(req)
                short_ways += table.num_tokens % BS != 0 and kv.allocator.ref_count(table.blocks[-1]) == 1
                fresh_ways += table.num_tokens % BS == 0 and len(table.blocks) == table.num_tokens // BS
                out = kv.append(req, 1, None if rng.random() < 0.05 else [rng.randrange(50)])
            elif op < 0.9:
                out = kv.commit(rng.choice(live))
            else:
                req = live.pop(rng.randrange(len(live)))
                kv.free(req)
                out = "freed"
            tables = {r: (list(t.blocks), t.num_tokens, list(t.keys), None if t.pending is None else list(t.pending))
                      for r in live for t in [kv.table(r)]}
            trace.append((out, tables, kv.allocator.num_free, [kv.allocator.ref_count(b) for b in range(40)]))
        return trace, short_ways, fresh_ways
    (short, used, fresh), (general, _, _) = drive(True), drive(False)
    assert used > 500 and fresh > 100    # both short ways were taken (795 and 250 times here)
    assert short == general


def test_a_block_key_hashes_each_token_id_as_4_little_endian_bytes() -> None:
    """Keys name the same blocks in every process and every version that hashes them alike: ids
    as 4 signed little-endian bytes each (packed in one call), digests (media rows) as themselves."""
    import hashlib

    from runtime.model_executor.kv.prefix_cache import chain_keys

    rng = random.Random(3)
    for _ in range(200):
        rows = [rng.randrange(-2**31, 2**31) for _ in range(BS)]
        if rng.random() < 0.3:
            rows[rng.randrange(BS)] = rng.randbytes(16)
        h = hashlib.blake2b(ROOT, digest_size=16)
        h.update(b"".join(r if isinstance(r, bytes) else r.to_bytes(4, "little", signed=True) for r in rows))
        assert chain_keys(ROOT, rows, BS) == [h.digest()]
    with pytest.raises(OverflowError):
        chain_keys(ROOT, [2**31] * BS, BS)
