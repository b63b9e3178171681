"""On a CUDA device: captured decode graphs replay to the eager step's logits and touch only new slots.

Skipped without a CUDA device (tests/conftest.py); `bash tools/gpu_check.sh` runs them.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.runtime.cuda_graphs.graph_factories import BLOCK, changed_slots, clone_cache, eager_decode, new_slot, prefilled, tiny_llama
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.components import component_class
from runtime.model_executor.compiled import DecodeGraphs
from runtime.conductor.local_run import LocalRun
from runtime.models.decoder_lm.executors import DecoderLMExecutor
from runtime.transport.messages import WorkItem
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

pytestmark = pytest.mark.gpu
BUCKETS = (1, 2, 4, 8)
STEPS = ([0, 1, 2], [2, 0], [1], [0, 1, 2], [1, 2])
# replayed graphs run the bucket's padded rows, eager the real ones: cuBLAS may pick other kernels for them. fp32:
# order differences, 1e-4 is ~800 eps (1.2e-7) on logits of order 1 after 2 layers; bf16: each rounding is 2^-8 =
# 3.9e-3 relative and a row's path has several (projections, norms, the LM head): 3e-2 is ~8 of them. Not measured
# here (no GPU on the machine that wrote this)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replayed_graphs_equal_eager_decode(dtype: torch.dtype) -> None:
    model = tiny_llama("triton", "cuda", dtype)
    manager, cache = prefilled(model, "cuda")
    reference = clone_cache(model, cache)
    before_capture = clone_cache(model, cache)
    graphs = DecodeGraphs(model, cache, BUCKETS, max_blocks=4)
    graphs.capture_all()
    assert graphs.use_graphs and graphs.prepared_buckets == BUCKETS
    padding = set(range(cache.padding_slot, cache.padding_slot + BLOCK))
    assert changed_slots(before_capture, cache) <= padding, "capture wrote a request's cache"
    gen = torch.Generator().manual_seed(2)
    tol = TOLERANCE[dtype]
    for reqs in STEPS:
        tokens = torch.randint(0, model.config.vocab_size, (len(reqs),), generator=gen).tolist()
        for r in reqs:
            manager.append(r, 1)
        before = clone_cache(model, cache)
        tables = [manager.table(r) for r in reqs]
        logits, hidden = graphs.run(tokens, [t.blocks for t in tables], [t.num_tokens for t in tables])
        want_logits, want_hidden = eager_decode(model, manager, reference, reqs, tokens)
        torch.testing.assert_close(logits, want_logits, atol=tol, rtol=tol)
        torch.testing.assert_close(hidden.float(), want_hidden.float(), atol=tol, rtol=tol)
        assert changed_slots(before, cache) - padding == {new_slot(manager, r) for r in reqs}


def test_executor_captures_its_capture_region_on_cuda() -> None:
    """The executor on CUDA captures every bucket of the plan's region and samples the eager path's tokens."""
    plan = compile_file(str(Path(__file__).resolve().parents[3] / "graphs" / "smollm2.yaml"),
                        Options(preset="tiny")).plan
    node = plan.node("lm")
    prompts = {0: [5, 9, 11, 3], 1: [7] * 17, 2: [1, 2]}
    runs = []
    for with_plan in (True, False):
        model = component_class(node.kind)(node.dims, {**node.args, "attention_backend": "triton"}).cuda().eval()
        executor = DecoderLMExecutor(node, model, 0, plan if with_plan else None)
        assert (executor.decode_graphs is not None) == with_plan
        for rid in prompts:
            executor.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
        run = LocalRun(executor)
        results = run.run([WorkItem(rid, tokens) for rid, tokens in prompts.items()], [{}] * 3)
        last = {rid: r.tokens[0] for rid, r in zip(prompts, results)}
        history = [dict(last)]
        for live in ([0, 1, 2], [2, 1], [0, 1, 2], [0]):
            results = run.run([WorkItem(rid, [last[rid]]) for rid in live], [{}] * len(live))
            last.update({rid: r.tokens[0] for rid, r in zip(live, results)})
            history.append(dict(last))
        runs.append(history)
    assert runs[0] == runs[1]
