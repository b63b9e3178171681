"""A decode step padded up to its batch bucket equals the unpadded step, and padding touches no request.

On CPU `DecodeGraphs` runs its padded step eagerly (no graph): the same static buffers,
padding rows, padding slot and per-bucket backend planning that a CUDA graph replays.
Batches shrink, grow, reorder and cross block boundaries between steps, so stale rows
and stale block-table columns of the static buffers are exercised too.
"""
from __future__ import annotations

import pytest
import torch

from tests.runtime.cuda_graphs.graph_factories import (BLOCK, changed_slots, clone_cache, eager_decode, new_slot, prefilled, real_blocks,
                             tiny_llama)
from mstar_compiler.catalogue import load_catalogue
from runtime.model_executor.components import component_class
from runtime.model_executor.compiled import DecodeGraphs, DecodeInputs, bucket_for

BUCKETS = (1, 2, 4, 8)
# requests decoding at each step: 3 of bucket 4, a reordered 2, a single one, all three again
STEPS = ([0, 1, 2], [2, 0], [1], [0, 1, 2])
# a padded step runs its bucket's rows (4 for 3 requests): exact on this machine (each row the same bits from MKL's
# sgemm and the attention backends), but a BLAS may block 4 rows otherwise than 3 on another CPU, and that is an fp32
# order difference of a few ulps (eps 1.2e-7) on logits |l| <= 0.6 and hidden states |h| <= 3.5 after 2 layers
TOL = 1e-5
# the KV blocks a step writes hold k/v projections of the same rows (|kv| <= 0.64): the same few ulps, at that scale
BLOCKS_TOL = 1e-6


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padded_step_equals_unpadded_and_writes_only_new_slots(backend: str) -> None:
    model = tiny_llama(backend)
    manager, cache = prefilled(model)
    reference = clone_cache(model, cache)          # advanced by the unpadded eager step
    graphs = DecodeGraphs(model, cache, BUCKETS, max_blocks=4, use_graphs=False)
    gen = torch.Generator().manual_seed(2)
    for reqs in STEPS:
        tokens = torch.randint(0, model.config.vocab_size, (len(reqs),), generator=gen).tolist()
        for r in reqs:
            manager.append(r, 1)
        for blocks in (*cache.k, *cache.v):
            blocks[cache.padding_block].zero_()     # so that this step's padding writes show
        before = clone_cache(model, cache)
        tables = [manager.table(r) for r in reqs]
        logits, hidden = graphs.run(tokens, [t.blocks for t in tables], [t.num_tokens for t in tables])
        want_logits, want_hidden = eager_decode(model, manager, reference, reqs, tokens)
        torch.testing.assert_close(logits, want_logits, atol=TOL, rtol=TOL)
        torch.testing.assert_close(hidden, want_hidden, atol=TOL, rtol=TOL)
        padding = set(range(cache.padding_slot, cache.padding_slot + BLOCK))
        changed = changed_slots(before, cache)
        assert changed - padding == {new_slot(manager, r) for r in reqs}
        assert bool(changed & padding) == (bucket_for(len(reqs), BUCKETS) > len(reqs)), "padding rows write only there"
        for got, want in zip(real_blocks(cache), real_blocks(reference)):
            torch.testing.assert_close(got, want, atol=BLOCKS_TOL, rtol=BLOCKS_TOL)


def test_fill_pads_rows_to_the_padding_slot_and_block() -> None:
    model = tiny_llama("torch")
    manager, cache = prefilled(model)
    inputs = DecodeInputs(cache, max_batch=4, max_blocks=3)
    for r in (0, 2):
        manager.append(r, 1)
    tables = [manager.table(r) for r in (0, 2)]
    batch = inputs.fill(4, [7, 9], [t.blocks for t in tables], [t.num_tokens for t in tables])
    assert inputs.input_ids(4).tolist() == [7, 9, 0, 0]
    assert inputs.positions(4).tolist() == [15, 32, 0, 0]
    assert batch.slot_mapping.tolist() == [new_slot(manager, 0), new_slot(manager, 2)] + [cache.padding_slot] * 2
    assert batch.seq_lens.tolist() == [16, 33, 1, 1] and batch.seq_lens_cpu == (16, 33, 1, 1)
    assert batch.block_tables[0, :1].tolist() == tables[0].blocks
    assert batch.block_tables[1, :3].tolist() == tables[1].blocks
    assert (batch.block_tables[2:, 0] == cache.padding_block).all()
    assert batch.block_tables_cpu[2:] == ((cache.padding_block,),) * 2
    assert inputs.fits([t.blocks for t in tables], [16, 33]) and not inputs.fits([[0] * 4], [49])
    assert not inputs.fits([[0]] * 5, [1] * 5), "more requests than the largest bucket"


def test_moe_models_are_refused_for_capture() -> None:
    """Sparse-MoE routing reads expert counts back to the host: no graph may be captured."""
    dims = load_catalogue()["qwen3_moe_lm"].presets["tiny"]
    model = component_class("qwen3_moe_lm")(dims, {"seed": 0, "attention_backend": "torch"}).eval()
    assert not model.is_graph_capturable and tiny_llama("torch").is_graph_capturable
    with pytest.raises(ValueError, match="cannot be CUDA-graph captured"):
        DecodeGraphs(model, model.make_kv_cache(4, BLOCK), BUCKETS, max_blocks=2, use_graphs=True)
