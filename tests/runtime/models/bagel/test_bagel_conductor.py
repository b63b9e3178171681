"""The conductor driving BAGEL's tasks against fake workers that answer every RunBatch at once.

What is checked is what the conductor sends: which Runs go out together, which inputs
they name (request inputs by modality and at most once per port, loop carries,
versioned keys for values pushed from another rank), and in which order walks run.
"""
from __future__ import annotations

import asyncio

import pytest
import torch

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.request import Request
from runtime.ranks.workers import WorkerSet
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.messages import BatchDone, ItemResult, RunBatch
from runtime.transport.queues import Envelope
from runtime.transport.request_params import RequestParams
from tests.runtime.serving.conftest import REPO

STEPS = 4
IMAGE = torch.zeros(32, 32, 3, dtype=torch.uint8)


def _plan(placement: str):
    graph = str(REPO / "graphs" / "bagel.yaml")
    return compile_file(graph, Options(preset="tiny", placement=placement)).plan


class FakeWorkers:
    """Records every RunBatch per step and answers it with an empty BatchDone."""

    def __init__(self, conductor: Conductor) -> None:
        self.conductor = conductor
        self.sent: list[tuple[int, RunBatch]] = []
        conductor.workers = WorkerSet("plan.bin", "tcp://fake", len(conductor.plan.ranks), set(), None, "info")
        for status in conductor.workers.ranks.values():
            status.is_ready = True
        conductor._send = self.send

    def send(self, rank: int, msg, tensors=None) -> None:
        if isinstance(msg, RunBatch):
            self.sent.append((rank, msg))
            items = [ItemResult(request_id=item.request_id) for item in msg.items]
            done = BatchDone(batch_id=msg.batch_id, rank=rank, items=items)
            self.conductor._events.put_nowait((rank, Envelope(done)))


def drive(placement: str, task: str, items: list) -> tuple[list[list[tuple[int, RunBatch]]], Request]:
    """Run one request to the end; the RunBatches of each conductor step."""
    plan = _plan(placement)
    conductor = Conductor(plan, ConductorConfig(plan_path="plan.bin"))
    workers = FakeWorkers(conductor)
    steps = []

    async def run() -> Request:
        req = conductor.submit(task, RequestParams(declared={"steps": STEPS, "max_tokens": 3},
                                                     sampling=SamplingParams(seed=1)), items)
        while not req.state.is_final:
            before = len(workers.sent)
            await conductor.step()
            steps.append(workers.sent[before:])
        return req

    req = asyncio.run(run())
    return [s for s in steps if s], req


def _runs(step: list[tuple[int, RunBatch]]) -> list[tuple[str, str]]:
    return [(b.node, b.items[0].walk) for _, b in step]


def test_t2i_runs_branches_together_and_carries_the_latent() -> None:
    steps, req = drive("single", "t2i", [("text", [7, 8, 9])])
    assert req.state.name == "FINISHED"
    assert _runs(steps[0]) == [("llm", "read_text_gen"), ("llm_cfg_img", "read_text_gen")]
    assert [b.items[0].tokens for _, b in steps[0]] == [[7, 8, 9], [7, 8, 9]]
    draws = [s for s in steps if s[0][1].items[0].walk == "draw" and s[0][1].node == "llm"]
    assert len(draws) == STEPS - 1
    for i, step in enumerate(draws):
        assert {b.node for _, b in step} == {"llm", "llm_cfg_text", "llm_cfg_img"}   # one step, one dispatch
        for _, b in step:
            item = b.items[0]
            assert item.step == i and item.tokens == []    # the prompt reached llm.tokens once, in read_text_gen
            assert item.inputs == ({} if i == 0 else {"latent": "cfg.latent"})   # step 0: the request's noise
    cfgs = [b.items[0] for s in steps for _, b in s if b.node == "cfg"]
    assert [c.step for c in cfgs] == list(range(STEPS - 1))
    assert cfgs[0].inputs == {"v_full": "llm.velocity", "v_text": "llm_cfg_text.velocity",
                              "v_img": "llm_cfg_img.velocity"}
    assert _runs(steps[-1]) == [("vae_dec", "draw")] and steps[-1][0][1].items[0].emit == ["image"]


def test_cfg_parallel_pushes_versioned_values_between_ranks() -> None:
    steps, _ = drive("cfg_parallel", "t2i", [("text", [7, 8, 9])])
    cfgs = [(rank, b.items[0]) for s in steps for rank, b in s if b.node == "cfg"]
    assert all(rank == 0 for rank, _ in cfgs)
    for n, (_, item) in enumerate(cfgs, start=1):
        assert sorted((r.port, r.rank, r.key) for r in item.routes) == [
            ("latent", 1, f"cfg.latent#{n}"), ("latent", 2, f"cfg.latent#{n}")]
        assert item.inputs["v_text"] == f"llm_cfg_text.velocity#{n}"   # from rank 1: never a stale one
        assert item.inputs["v_full"] == "llm.velocity"                 # same rank: the plain key
    text_branch = [(rank, b.items[0]) for s in steps for rank, b in s
                   if b.node == "llm_cfg_text" and b.items[0].walk == "draw"]
    assert [rank for rank, _ in text_branch] == [1] * (STEPS - 1)
    assert [it.inputs.get("latent") for _, it in text_branch] == [None, "cfg.latent#1", "cfg.latent#2"]
    assert all(r.key == f"llm_cfg_text.velocity#{n}" for n, (_, it) in enumerate(text_branch, 1) for r in it.routes)


def test_i2i_reads_each_input_in_bagel_order() -> None:
    steps, _ = drive("single", "i2i", [("image", IMAGE), ("text", [5])])
    reads = [r for s in steps for r in _runs(s) if r[1] != "draw"]
    assert reads == [("vae_enc", "read_image_vae"), ("llm", "read_image_vae"), ("llm_cfg_text", "read_image_vae"),
                     ("vit", "read_image_vit"), ("llm", "read_image_vit"), ("llm_cfg_text", "read_image_vit"),
                     ("llm", "read_text_gen"), ("llm_cfg_img", "read_text_gen")]
    image_reads = [b.items[0] for s in steps for _, b in s if b.items[0].walk.startswith("read_image")]
    assert all(it.tokens == [] for it in image_reads)           # an image item never feeds a tokens port
    assert image_reads[0].inputs == {"image": "input:vae_enc.image"}


@pytest.mark.parametrize("placement", ["single", "cfg_parallel"])
def test_i2t_answer_starts_empty_and_decodes_on_the_full_branch(placement: str) -> None:
    steps, req = drive(placement, "i2t", [("image", IMAGE), ("text", [5, 6])])
    runs = [r for s in steps for r in _runs(s)]
    assert runs[:3] == [("vit", "read_image"), ("llm", "read_image"), ("llm", "read_text")]
    answers = [b.items[0] for s in steps for rank, b in s if b.items[0].walk == "answer"]
    assert len(answers) == 3 and all(it.tokens == [] for it in answers)   # fake workers sample nothing
    assert req.finish_reason == "length"
