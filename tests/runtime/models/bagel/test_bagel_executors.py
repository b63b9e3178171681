"""BAGEL's executors on one rank against BAGEL's call sequence run directly on the components.

The executors see WorkItems as the conductor sends them; the three CFG branches of
several requests run as one LM call, branches with equal histories share KV blocks,
and a branch the guidance does not use at a step is skipped. None of it may change a
result: every image is compared with the oracle (every branch computed, no sharing).
"""
from __future__ import annotations

import pytest
import torch

from runtime.models.bagel.segments import SegmentKind as K
from runtime.worker.executors import ExecResult, Executor
from runtime.models.bagel.roles import cfg_consumer, segment_kinds
from runtime.transport.messages import BatchDone, RunBatch, WorkItem
from runtime.transport.queues import Envelope
from runtime.worker.opened import OpenedRequests
from runtime.worker.openmp import ThreadGovernor
from runtime.worker.worker import Worker
from tests.runtime.models.bagel.bagel_harness import LMS, Driver, Oracle, rank_executors, tiny_plan

PARAMS = {"steps": 4, "timestep_shift": 3.0, "cfg_text_scale": 4.0, "cfg_img_scale": 1.0,
          "seed": 11, "height": 32, "width": 48, "max_tokens": 4, "temperature": 0.0}


@pytest.fixture(scope="module")
def plan():
    return tiny_plan()


@pytest.fixture()
def rank(plan):
    torch.manual_seed(0)
    return rank_executors(plan)


def _blocks(drv: Driver, rid: int, node: str) -> list[int]:
    """The node's table of the request, as the conductor keeps it (one pool for the three branches)."""
    return drv.lms.pool.tables.table((rid, node)).blocks


def test_segment_kinds_and_roles_come_from_the_plan(plan) -> None:
    assert segment_kinds(plan, "llm") == {
        "read_text": K.TEXT, "read_image": K.VIT, "read_text_gen": K.TEXT, "read_image_vit": K.VIT,
        "read_image_vae": K.VAE, "answer": K.DECODE, "draw": K.GEN}
    assert [cfg_consumer(plan, n)[1] for n in LMS] == ["full", "cfg_text", "cfg_img"]


def test_t2i_batched_and_shared_equals_bagel(plan, rank) -> None:
    """Two T2I requests (one with guidance off for its last steps) run together == each alone."""
    executors, modules = rank
    drv = Driver(plan, executors)
    prompts = {1: [3, 4, 5], 2: [9, 8]}
    params = {1: PARAMS, 2: {**PARAMS, "seed": 5, "steps": 6, "timestep_shift": 1.0, "cfg_img_scale": 2.0}}
    for rid, p in params.items():
        drv.open(rid, p)
    drv.group([(n, [WorkItem(r, tokens=prompts[r], walk="read_text_gen") for r in prompts], [{}, {}])
               for n in ("llm", "llm_cfg_img")])
    assert _blocks(drv, 1, "llm_cfg_img") == _blocks(drv, 1, "llm")   # computed once, shared
    drv.draw([1], 4)
    drv.draw([2], 6)
    for rid in prompts:
        oracle = Oracle(plan, modules, params[rid])
        oracle.text(prompts[rid])
        want = oracle.generate()
        got = drv.value(rid, "vae_dec.image")
        assert got.shape == (3, 32, 48)
        # two requests drawn together against each alone: other row counts through the LM (GEMM blockings), then
        # the Euler steps and the VAE, fp32 order differences on pixels in [-1, 1]; measured exact here
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    img_branch = drv.value(2, "llm_cfg_img.velocity")
    assert img_branch.numel() == 0    # t = 0.2 is outside cfg_interval (0.4, 1]: the branch did not run


def test_i2i_shares_the_image_prefix_and_equals_bagel(plan, rank) -> None:
    executors, modules = rank
    drv = Driver(plan, executors)
    params = {**PARAMS, "cfg_img_scale": 2.0, "height": 64, "width": 64}
    image = torch.randint(0, 256, (64, 64, 3), dtype=torch.uint8)
    drv.open(1, params)
    drv.group([("vae_enc", [WorkItem(1, walk="read_image_vae")], [{"image": image}])])
    latent = {"latent": drv.value(1, "vae_enc.latent")}
    drv.group([("llm", [WorkItem(1, walk="read_image_vae")], [latent])])          # the branches one call apart:
    drv.group([("llm_cfg_text", [WorkItem(1, walk="read_image_vae")], [latent])])  # the second forks the first
    drv.group([("vit", [WorkItem(1, walk="read_image_vit")], [{"image": image}])])
    embeds = {"embeds": drv.value(1, "vit.hidden")}
    drv.group([(n, [WorkItem(1, walk="read_image_vit")], [embeds]) for n in ("llm", "llm_cfg_text")])
    full, text_dropped = _blocks(drv, 1, "llm"), _blocks(drv, 1, "llm_cfg_text")
    assert text_dropped == full     # the whole image prefix is shared, nothing copied
    drv.group([(n, [WorkItem(1, tokens=[6, 7], walk="read_text_gen")], [{}]) for n in ("llm", "llm_cfg_img")])
    assert _blocks(drv, 1, "llm_cfg_text") == text_dropped and _blocks(drv, 1, "llm")[0] == full[0]
    drv.draw([1], PARAMS["steps"])
    oracle = Oracle(plan, modules, params)
    oracle.image(image)
    oracle.text([6, 7])
    # as above (shared prefix blocks, branches batched): fp32 order differences only; measured exact here
    torch.testing.assert_close(drv.value(1, "vae_dec.image"), oracle.generate(), rtol=1e-4, atol=1e-4)


def test_i2t_decodes_from_bos_and_frees_every_branch(plan, rank) -> None:
    executors, _ = rank
    drv = Driver(plan, executors)
    drv.open(1, PARAMS)
    drv.group([("llm", [WorkItem(1, tokens=[5, 6], walk="read_text")], [{}])])
    engine = executors["llm"].engine
    tokens = []
    for step in range(3):
        out = drv.lms.run([("llm", [WorkItem(1, tokens=tokens[-1:], step=step, walk="answer")], [{}])])
        tokens += out[0][0].tokens
    assert len(tokens) == 3 and all(0 <= t < plan.node("llm").dims["vocab_size"] for t in tokens)
    assert engine.ropes[(1, "full")] == 2 + 2 + 3     # [bos] 5 6 [eos], then bos and two sampled tokens
    drv.close(1)
    assert engine.used_blocks("full") == 0 and not engine.ropes and 1 not in engine.params
    assert drv.lms.pool.used_blocks == 0 and not drv.lms.pool.holders()


class _FakeControl:
    def __init__(self) -> None:
        self.sent = []

    def send(self, msg, tensors=None) -> None:
        self.sent.append(msg)


class _Recorder(Executor):
    """An executor that records how it was called."""

    def __init__(self, calls: list, group=None) -> None:
        self.calls, self.group = calls, group

    def run(self, items, inputs):
        self.calls.append(("run", len(items)))
        return [ExecResult() for _ in items]

    def run_group(self, calls):
        self.calls.append(("group", len(calls)))
        return [[ExecResult() for _ in items] for _, items, _ in calls]


def test_worker_runs_queued_batches_of_one_group_as_one_call() -> None:
    calls: list = []
    shared = _Recorder(calls)
    worker = object.__new__(Worker)
    worker.rank, worker.values, worker.control = 0, {}, _FakeControl()
    worker.requests, worker.backlog = OpenedRequests(), []
    worker.requests.open(1)      # the conductor opened request 1 here: its Runs are served
    worker.executors = {"a": _Recorder(calls, shared), "b": _Recorder(calls, shared), "c": _Recorder(calls)}
    worker.governor = ThreadGovernor(1, torch.set_num_threads)   # one thread: nothing to govern
    envs = [Envelope(RunBatch(batch_id=i, node=n, items=[WorkItem(1)])) for i, n in enumerate("acb", 1)]
    assert worker._handle_queued(envs)
    assert sorted(calls) == [("group", 2), ("run", 1)]
    assert sorted(m.batch_id for m in worker.control.sent if isinstance(m, BatchDone)) == [1, 2, 3]
