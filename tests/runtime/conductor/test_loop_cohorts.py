"""Rows of a loop whose body runs several nodes on one rank move as one cohort (Scheduler._place): requests that
enter Qwen3-Omni's `speak` loop (talker, code predictor) a few steps apart join one batch, instead of two groups
alternating between the two nodes in half-full batches until they end. The real conductor and scheduler drive
the tiny plan against workers that answer every Run at once with the real messages
(runtime/conductor/null_workers.py)."""
from __future__ import annotations

import asyncio
import collections
from pathlib import Path

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.null_workers import NullWorkers
from runtime.conductor.request import RequestState
from runtime.transport.messages import RunBatch
from runtime.transport.request_params import RequestParams

ROOT = Path(__file__).resolve().parents[3]
FRAMES, GROUP = 12, 4


def batch_sizes(*, cohorts: bool) -> tuple[dict[str, list[int]], list]:
    """Two groups of GROUP voice chats, the second submitted three steps after the first: each node's batch sizes."""
    plan = compile_file(str(ROOT / "graphs/qwen3_omni.yaml"), Options(preset="tiny")).plan
    loop = asyncio.new_event_loop()
    try:
        conductor = Conductor(plan, ConductorConfig(plan_path="null"))
        workers = NullWorkers(conductor)
        if not cohorts:
            conductor.index.cohort_ops = {}
        sizes: dict[str, list[int]] = collections.defaultdict(list)

        def send(rank, msg, tensors=None) -> None:
            if isinstance(msg, RunBatch) and not msg.follower:
                sizes[msg.node].append(len(msg.items))
            workers.send(rank, msg, tensors)
        conductor._send = send

        def submit() -> list:
            declared = {"max_tokens": 4, "max_audio_frames": FRAMES}
            return [conductor.submit("voice_chat", RequestParams(declared=dict(declared)), [("text", [1, 2, 3])])
                    for _ in range(GROUP)]

        async def drive() -> list:
            reqs = submit()
            for step in range(400):
                if step == 3:
                    reqs += submit()
                elif step > 3 and all(r.state.is_final for r in reqs):
                    break
                await conductor.step()
            return reqs
        return sizes, loop.run_until_complete(drive())
    finally:
        loop.close()


def test_only_loops_of_several_nodes_are_cohorts() -> None:
    plan = compile_file(str(ROOT / "graphs/qwen3_omni.yaml"), Options(preset="tiny")).plan
    conductor = Conductor(plan, ConductorConfig(plan_path="null"))
    assert conductor.index.cohort_ops == {"speak": {"talker": 1, "code_predictor": 2}}   # think: one node; read_audio:
                                                                                    # no loop


def test_a_loop_entered_later_joins_the_rows_already_in_it() -> None:
    sizes, reqs = batch_sizes(cohorts=True)
    assert all(r.state == RequestState.FINISHED for r in reqs)
    for node in ("talker", "code_predictor"):
        assert sum(sizes[node]) == 2 * GROUP * FRAMES               # every frame of every request, once
        assert max(sizes[node]) == 2 * GROUP                        # the groups met
        assert len(sizes[node]) < 2 * FRAMES                        # and did not alternate to the end


def test_a_parallel_s_branches_are_one_op_of_their_loop() -> None:
    """BAGEL's denoising loop: its three CFG branches (three nodes on one rank) run in one step, as one op."""
    plan = compile_file(str(ROOT / "graphs/bagel.yaml"), Options(preset="tiny")).plan
    ops = Conductor(plan, ConductorConfig(plan_path="null")).index.cohort_ops["draw"]
    assert ops["llm"] == ops["llm_cfg_text"] == ops["llm_cfg_img"] != ops["cfg"]


def test_without_cohorts_the_two_groups_alternate_to_the_end() -> None:
    """What the rule prevents, shown by switching it off: the same work in twice the batches."""
    sizes, reqs = batch_sizes(cohorts=False)
    assert all(r.state == RequestState.FINISHED for r in reqs)
    assert sizes["talker"] == [GROUP] * (2 * FRAMES)
