"""Continuous batching must not change the Qwen3-Omni thinker's results: two requests' decode steps in
one batch give the logits each gives alone. Each row has three M-RoPE positions (3, n); packed
along the wrong axis, two rows of one position each became one row of six and the second request
decoded at the first one's positions."""
from __future__ import annotations

import pytest
import torch

from mstar_compiler.pipeline import Options, compile_file
from runtime.conductor.local_run import LocalRun
from runtime.worker.executors import executor_for
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.loader import build_module

PROMPTS = {1: list(range(10, 30)), 2: list(range(40, 57))}


@pytest.fixture(scope="module")
def thinker_parts():
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    return plan, build_module(plan.node("thinker"), None).eval()


def _decode_logits(plan, module, batched: bool) -> torch.Tensor:
    run = LocalRun(executor_for(plan.node("thinker"), module, 0, plan))    # its tables, as the conductor keeps them
    thinker = run.executor
    assert thinker.mrope is not None            # the plan reads pictures: (3, n) positions
    got, spy = [], thinker.model.compute_logits
    thinker.model.compute_logits = lambda h: got.append(spy(h)) or got[-1]
    thinker = run
    for rid, prompt in PROMPTS.items():
        thinker.open(rid, RequestParams(sampling=SamplingParams(temperature=0.0)))
        thinker.run([WorkItem(request_id=rid, tokens=prompt)], [{}])
    steps = [WorkItem(request_id=1, tokens=[5]), WorkItem(request_id=2, tokens=[6])]
    if batched:
        thinker.run(steps, [{}, {}])
    else:
        for step in steps:
            thinker.run([step], [{}])
    return torch.cat(got[len(PROMPTS):])       # (2, vocab): the decode steps' logits


def test_a_batch_of_decode_steps_gives_each_request_its_logits_alone(thinker_parts) -> None:
    plan, module = thinker_parts
    # fp32; the module's linears are unpacked here (build_module, not a worker's loader), so MKL's sgemm blocks 2 rows
    # otherwise than 1, and the MoE's experts see other row counts: order differences of a few ulps (eps 1.2e-7) on
    # logits |l| <= 0.51; measured max 8.9e-8
    torch.testing.assert_close(_decode_logits(plan, module, batched=True),
                               _decode_logits(plan, module, batched=False), atol=1e-4, rtol=0)
