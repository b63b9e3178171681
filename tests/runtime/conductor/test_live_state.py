"""LiveState snapshots of a real conductor (BAGEL tiny plan, no workers): where each request rests,
waiting or running, through a Parallel of the CFG branches; KV blocks; counts by task."""
from __future__ import annotations


from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.request import RequestState
from runtime.ranks.workers import WorkerSet
from tests.runtime.serving.conftest import REPO
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams

BRANCHES = ("llm", "llm_cfg_text", "llm_cfg_img")
READ_TEXT_GEN = ("llm", "llm_cfg_img")      # bagel.yaml: the text-dropped branch does not read the prompt


def _conductor() -> tuple[Conductor, list]:
    plan = compile_file(str(REPO / "graphs" / "bagel.yaml"), Options(preset="tiny")).plan
    conductor = Conductor(plan, ConductorConfig(plan_path="plan.bin"))
    conductor.workers = WorkerSet("plan.bin", "tcp://none", len(plan.ranks), set(), None, "info")
    for status in conductor.workers.ranks.values():
        status.is_ready = True
    for node in BRANCHES:
        conductor.ledger.add_pool(0, node, 64, 16)
    sent: list = []
    conductor._send = lambda rank, msg, tensors=None: sent.append(msg)    # nothing answers: batches stay in flight
    return conductor, sent


def _schedule(conductor: Conductor) -> None:
    running = [r for r in conductor.requests.values() if r.state == RequestState.RUNNING]
    for batch in conductor.scheduler.schedule(running, conductor.waiting, set(), {0}):
        conductor._dispatch(batch)


def test_a_t2i_prompt_waits_then_runs_on_both_branches_of_its_parallel() -> None:
    conductor, _ = _conductor()
    conductor.submit("t2i", RequestParams(declared={"steps": 4}, sampling=SamplingParams(seed=1), family={"width": 32, "height": 32}), [("text", [5, 6, 7])])
    conductor.submit("chat", RequestParams(declared={"max_tokens": 4}), [("text", [5, 6])])
    before = conductor.live.snapshot(conductor)
    assert {n: (before["nodes"][n]["waiting"], before["nodes"][n]["running"]) for n in BRANCHES} == \
        {"llm": (2, 0), "llm_cfg_text": (0, 0), "llm_cfg_img": (1, 0)}
    assert before["tasks"]["t2i"]["waiting"] == before["tasks"]["chat"]["waiting"] == 1
    _schedule(conductor)
    after = conductor.live.snapshot(conductor)
    # the t2i prompt runs on both branches at once; the chat's prefill shares llm's batch
    assert {n: after["nodes"][n]["running"] for n in BRANCHES} == {"llm": 2, "llm_cfg_text": 0, "llm_cfg_img": 1}
    assert after["nodes"]["llm"]["waiting"] == 0
    t2i = next(r for r in after["requests"] if r["task"] == "t2i")
    assert t2i["state"] == "running" and t2i["tracks"][0]["walk"] == "read_text_gen"
    assert sorted(n["node"] for n in t2i["tracks"][0]["nodes"]) == sorted(READ_TEXT_GEN)
    assert all(n["running"] for n in t2i["tracks"][0]["nodes"])
    assert after["nodes"]["llm"]["kv"] == {"used_blocks": conductor.ledger.pool(0, "llm").used_blocks, "num_blocks": 64}
    assert after["nodes"]["llm"]["kv"]["used_blocks"] > 0 and after["nodes"]["vae_dec"]["kv"] is None
    assert after["num_requests"] == 2 and after["ranks"]["0"]["busy"] == 0.0


def test_batches_and_busy_share_count_finished_batches_only() -> None:
    conductor, _ = _conductor()
    conductor.live.snapshot(conductor)
    conductor.live.observe_batch([0], "llm", 3, 50.0)
    conductor.live.observe_batch([0], "llm", 2, 50.0)
    snap = conductor.live.snapshot(conductor)
    assert (snap["nodes"]["llm"]["batches"], snap["nodes"]["llm"]["last_batch"]) == (2, 2)
    assert snap["nodes"]["llm"]["batches_per_s"] == 2 / snap["window_s"]
    assert snap["ranks"]["0"]["busy"] == min(1.0, 0.1 / snap["window_s"])
    again = conductor.live.snapshot(conductor)           # a new window: nothing finished in it
    assert again["nodes"]["llm"]["batches_per_s"] == 0 and again["ranks"]["0"]["busy"] == 0
