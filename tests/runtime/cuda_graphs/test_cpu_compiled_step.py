"""The CPU backend of capture regions: a bucket's decode step compiled by inductor equals the eager step.

One small bucket (4) on the tiny Llama, so the one compile stays short. Requests decode
across block boundaries (the block-table width grows), shrink to fewer rows (padding) and
reorder; every step is compared with the unpadded eager step of the torch backend, and
the width change must not recompile (the width is marked dynamic), and neither must the first
step after a compile on a model that had run nothing before (a worker compiles at load).

Tolerance: inductor fuses the fp32 reductions (RMSNorm means, q.k and p.v sums, softmax)
in another order than the eager kernels, so logits differ in the last bits: |diff| <= 1e-4
+ 1e-4 * |logit| (fp32 epsilon is 1.2e-7; a 2-layer model's logits are O(1)), and the
greedy token must be the same.
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from runtime.model_executor.compiled import DecodeGraphs
from runtime.model_executor.compiled.cpu_compile import cpp_compiler
from runtime import progress
from tests.runtime.cuda_graphs.graph_factories import changed_slots, clone_cache, eager_decode, new_slot, prefilled, tiny_llama

# requests decoding at each step: all three (two open a new block), a reordered 2, one, all three
STEPS = ([0, 1, 2], [2, 0], [1], [0, 1, 2])

pytestmark = pytest.mark.skipif(cpp_compiler() is None, reason="no C++ compiler (g++/c++/clang++): inductor's "
                                "CPU backend cannot build the compiled step")


def test_compiled_step_matches_eager_without_recompiling() -> None:
    model = tiny_llama("torch")
    # the cache is filled by a twin (same seed, same weights): the compiled model has run nothing
    # before its compile, as in a worker, which compiles at load
    manager, cache = prefilled(tiny_llama("torch"))
    reference = clone_cache(model, cache)
    graphs = DecodeGraphs(model, cache, (4,), max_blocks=4, compiled=True)
    steps = progress.snapshot()[0]
    graphs.capture_all()                               # the compile happens here, on padding rows
    # a start step the worker's heartbeat reports (the conductor waits while steps come)
    assert progress.snapshot() == (steps + 1, "compiled the decode step for batches of 4")
    compiles = counters["stats"]["unique_graphs"]
    gen = torch.Generator().manual_seed(2)
    for reqs in STEPS:
        tokens = torch.randint(0, model.config.vocab_size, (len(reqs),), generator=gen).tolist()
        for r in reqs:
            manager.append(r, 1)
        before = clone_cache(model, cache)
        tables = [manager.table(r) for r in reqs]
        with torch.inference_mode():     # as the executor calls it (its `run` is in inference mode)
            logits, hidden = graphs.run(tokens, [t.blocks for t in tables], [t.num_tokens for t in tables])
        want_logits, _ = eager_decode(model, manager, reference, reqs, tokens)
        # inductor's fused fp32 reductions in another order (the module doc): measured max |diff| 1.8e-7 at |logit| <=
        # 0.54, 0.1% of the bound
        torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)
        assert logits.argmax(-1).tolist() == want_logits.argmax(-1).tolist()
        changed = changed_slots(before, cache) - set(range(cache.padding_slot, cache.padding_slot + cache.block_size))
        assert changed == {new_slot(manager, r) for r in reqs}, "the compiled step writes each request's new slot only"
    assert counters["stats"]["unique_graphs"] == compiles, "a new context length recompiled the step"
