"""BAGEL's prefix cache across requests and CFG branches, run in-process on one rank's executors with
their tables kept as the conductor keeps them (`LocalGroup`: one pool, each Run's rows counted and keyed
by runtime/models/bagel/row_keys.py before the executors run).

Every request runs one segment per LM call (what `--batch-invariant` gives a server), so the
same requests with the cache on and off must give bit-equal images: a reused block holds the
very bytes the request would have computed. The hit counters show what was reused.
"""
from __future__ import annotations

import pytest
import torch

from runtime.conductor.request import SizedInput
from runtime.transport.messages import WorkItem
from tests.runtime.models.bagel.bagel_harness import Driver, rank_executors, tiny_plan

PARAMS = {"steps": 3, "timestep_shift": 3.0, "cfg_text_scale": 4.0, "cfg_img_scale": 2.0,
          "seed": 11, "height": 32, "width": 32, "max_tokens": 4, "temperature": 0.0}


@pytest.fixture(scope="module")
def plan():
    return tiny_plan()


def _driver(plan, prefix_cache: bool) -> Driver:
    torch.manual_seed(0)
    executors, _ = rank_executors(plan)
    return Driver(plan, executors, prefix_cache)


def _stats(drv: Driver):
    return drv.lms.pool.stats


def _t2i(drv: Driver, rid: int, prompt: list[int], seed: int) -> torch.Tensor:
    drv.open(rid, {**PARAMS, "seed": seed})
    drv.group([(n, [WorkItem(rid, tokens=prompt, walk="read_text_gen")], [{}]) for n in ("llm", "llm_cfg_img")])
    drv.draw([rid], PARAMS["steps"])
    return drv.value(rid, "vae_dec.image")


def _i2i(drv: Driver, rid: int, image: torch.Tensor, prompt: list[int]) -> torch.Tensor:
    drv.open(rid, PARAMS)
    drv.group([("vae_enc", [WorkItem(rid, walk="read_image_vae")], [{"image": image}])])
    latent = {"latent": drv.value(rid, "vae_enc.latent")}
    drv.group([("llm", [WorkItem(rid, walk="read_image_vae")], [latent])])
    drv.group([("llm_cfg_text", [WorkItem(rid, walk="read_image_vae")], [latent])])
    drv.group([("vit", [WorkItem(rid, walk="read_image_vit")], [{"image": image}])])
    embeds = {"embeds": drv.value(rid, "vit.hidden")}
    drv.group([(n, [WorkItem(rid, walk="read_image_vit")], [embeds]) for n in ("llm", "llm_cfg_text")])
    drv.group([(n, [WorkItem(rid, tokens=prompt, walk="read_text_gen")], [{}]) for n in ("llm", "llm_cfg_img")])
    drv.draw([rid], PARAMS["steps"])
    return drv.value(rid, "vae_dec.image")


def _close(drv: Driver, rid: int) -> None:
    drv.close(rid)


def test_t2i_with_a_shared_prompt_reuses_it_and_equals_the_cache_off_image(plan) -> None:
    prompt = list(range(3, 40))                    # 39 rows with bos/eos: 2 full blocks and a tail
    images = {}
    for on in (True, False):
        drv = _driver(plan, on)
        images[on] = [_t2i(drv, 1, prompt, seed=11)]
        _close(drv, 1)                             # its blocks stay cached, evictable
        before = _stats(drv).hit_tokens if on else 0
        images[on].append(_t2i(drv, 2, prompt, seed=5))
        if on:   # the second request's full branch took the prompt's rows whole; cfg_img forked them
            assert _stats(drv).hit_tokens - before == len(prompt) + 2 and _stats(drv).hits == 1
    for got, want in zip(images[True], images[False]):
        assert torch.equal(got, want)
    assert not torch.equal(images[True][0], images[True][1])   # other seeds: other images


def test_i2i_of_an_image_seen_before_reuses_its_context_and_equals_the_cache_off_image(plan) -> None:
    gen = torch.Generator().manual_seed(3)
    image = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=gen)
    other = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=gen)
    edits = [(image, [6, 7]), (image, [8, 9, 10]), (other, [6, 7])]
    images = {}
    for on in (True, False):
        drv = _driver(plan, on)
        images[on], hits = [], []
        for rid, (img, prompt) in enumerate(edits, start=1):
            before = _stats(drv).hits if on else 0
            images[on].append(_i2i(drv, rid, img, prompt))
            hits.append(_stats(drv).hits - before if on else 0)
            _close(drv, rid)
        if on:   # the second edit reuses the image's VAE and ViT rows; the third, another image,
            assert hits == [0, 2, 1]   # only its image-dropped branch: the first edit's prompt alone
    for got, want in zip(images[True], images[False]):
        assert torch.equal(got, want)


def test_a_failed_forward_leaves_no_block_of_its_rows_reachable(plan) -> None:
    """A prompt whose call fails (a malformed ViT output beside it) is computed again by the next request."""
    drv = _driver(plan, True)
    prompt = list(range(50, 90))
    drv.open(1, PARAMS)
    drv.open(2, PARAMS)
    drv.pictures[2] = SizedInput(torch.zeros(64, 64, 3, dtype=torch.uint8), 16)
    bad = {"embeds": torch.zeros(16, 7)}            # not the LM's hidden size: the forward raises
    with pytest.raises(RuntimeError):
        drv.lms.run([("llm", [WorkItem(1, tokens=prompt, walk="read_text_gen"),
                              WorkItem(2, walk="read_image_vit")], [{}, bad])], drv.pictures)
    _close(drv, 1)
    _close(drv, 2)
    assert drv.lms.pool.tables.allocator.num_cached == 0 and drv.lms.pool.used_blocks == 0
    got = _t2i(drv, 3, prompt, seed=11)
    assert _stats(drv).hit_tokens == 0
    want = _t2i(_driver(plan, False), 3, prompt, seed=11)
    assert torch.equal(got, want)


def test_the_pool_holds_fewer_blocks_than_its_sequences_in_full(plan) -> None:
    """What the conductor charges BAGEL's pool (runtime/conductor/kv_ledger.py): the blocks its one pool
    holds, below the full blocks of every sequence (CFG branches sharing a context, and an image two edits
    share), which is what a ledger blind to the sharing would have to charge. Each branch's table on the
    worker is the conductor's, block for block."""
    gen = torch.Generator().manual_seed(4)
    image = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=gen)
    drv = _driver(plan, True)
    for rid in (1, 2):
        _i2i(drv, rid, image, [6, 7])
    pool, engine = drv.lms.pool, drv.ex["llm"].engine
    full = sum(-(-pool.held(seq) // pool.block_size) for seq in pool.holders())
    assert {drv.ex[n].kv_pool for n in drv.lms.executors} == {"llm"}
    assert 0 < pool.used_blocks < full
    for rid, node in pool.holders():
        role = drv.ex[node].role
        assert engine.tables.table((rid, role)).blocks == pool.tables.table((rid, node)).blocks
