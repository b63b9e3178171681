"""The decoder LM executor with prefix caching: a request reusing another's cached prompt blocks
computes only its suffix and samples what a cache-less executor samples; a forward that fails
leaves none of its blocks findable."""
from __future__ import annotations

from pathlib import Path

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.model_executor.components import component_class
from runtime.conductor.local_run import LocalRun
from runtime.models.decoder_lm.executors import DecoderLMExecutor
from runtime.transport.messages import WorkItem
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

GRAPHS = Path(__file__).resolve().parents[4] / "graphs"
SHARED = [(7 * i + 3) % 200 for i in range(40)]     # 2 full blocks of 16 + 8 tokens


@pytest.fixture(scope="module")
def plan():
    return compile_file(str(GRAPHS / "smollm2.yaml"), Options(preset="tiny")).plan


def executor(plan, prefix_cache: bool) -> LocalRun:
    node = plan.node("lm")
    model = component_class(node.kind)(node.dims, node.args).eval()
    ex = DecoderLMExecutor(node, model, 0, plan, prefix_cache=prefix_cache)
    assert bool(ex.kv_prefix_key) == prefix_cache
    return LocalRun(ex)


def generate(run: LocalRun, rid: int, prompt: list[int], steps: int, cached: int = 0) -> list[int]:
    """Greedy tokens; `cached`: the prompt tokens its first Run must reuse (the tables decide it)."""
    run.executor.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
    first = WorkItem(request_id=rid, tokens=prompt)
    out = run.run([first], [{}])
    assert first.cached == cached
    tokens = out[0].tokens
    for _ in range(steps):
        tokens += run.run([WorkItem(request_id=rid, tokens=tokens[-1:])], [{}])[0].tokens
    return tokens


def test_a_reused_prefix_samples_what_a_full_prefill_samples(plan) -> None:
    cached, plain = executor(plan, True), executor(plan, False)
    generate(cached, 1, SHARED + [11, 12, 13], 4)
    prompt = SHARED + [21, 22, 23, 24]
    hit = cached.pool.cached_prefix(2, prompt)
    assert hit == 32
    assert generate(cached, 2, prompt, 6, cached=hit) == generate(plain, 2, prompt, 6)
    worker = cached.executor.blocks                  # the worker's copy of the tables: the conductor's
    assert worker.table(2).blocks[:2] == worker.table(1).blocks[:2]
    assert worker.table(2).blocks == cached.pool.tables.table(2).blocks


def test_a_failed_forward_caches_none_of_its_blocks(plan, monkeypatch: pytest.MonkeyPatch) -> None:
    run = executor(plan, True)
    generate(run, 1, SHARED[:17], 0)                  # caches the first block only
    prompt = SHARED + [5, 6]
    hit = run.pool.cached_prefix(2, prompt)
    assert hit == 16

    def broken(*args, **kwargs):
        raise RuntimeError("forward failed half way")
    monkeypatch.setattr(run.executor.model, "forward", broken)
    with pytest.raises(RuntimeError, match="half way"):
        run.run([WorkItem(request_id=2, tokens=prompt)], [{}])
    run.close(2)
    assert run.pool.cached_prefix(3, prompt) == 16   # the second block was allocated, never written: not found
    monkeypatch.undo()
    assert generate(run, 3, prompt, 2, cached=16) == generate(executor(plan, False), 3, prompt, 2)


def test_a_run_whose_table_is_too_short_fails_the_batch_loudly(plan) -> None:
    """The worker allocates nothing: a Run told fewer blocks than its tokens need is refused, naming
    the request, and its close leaves nothing held."""
    run = executor(plan, True)
    ex = run.executor
    with pytest.raises(ValueError, match="request 1: 40 cache rows do not fit the 1 blocks"):
        ex.run([WorkItem(request_id=1, tokens=SHARED, kv_at=0, kv_blocks=[0])], [{}])
    ex.close(1, kv_only=True)
    assert ex.kv_used_blocks() == 0
