"""Steady decode rows (runtime/conductor/steady.py) change nothing but the conductor's own work:
the same requests, driven by workers that answer with their KV length (so any miscount of a
cache shows in the tokens), send the same batches and end with the same outputs, KV counts and
preemptions with the steady rows as through the general path alone (steady rows never made)."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor import scheduler as scheduler_module
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.conductor.scheduler import SchedulerConfig
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.request_params import RequestParams
from tests.runtime.conductor.cache_workers import POISON, CacheWorkers

ROOT = Path(__file__).resolve().parents[3]
REQUESTS, WAVE = 96, 16


class LengthWorkers(CacheWorkers):
    """CacheWorkers that record every message as it was encoded (a reused item, as it was sent)."""

    def __init__(self, conductor: Conductor, kv_blocks: int) -> None:
        super().__init__(conductor, kv_blocks)
        self.sent: list[dict] = []

    def send(self, rank: int, msg, tensors: dict | None = None) -> None:
        self.sent.append(msgspec.to_builtins(msg))
        super().send(rank, msg, tensors)


def run(steady: bool, monkeypatch: pytest.MonkeyPatch, kv_blocks: int, max_batch_tokens: int,
        longest_prompt: int) -> tuple[list, list, dict, int]:
    """Drive ~48 requests arriving in waves to their ends; what was sent, each request's outcome,
    the KV pool's counts, and how many placed rows were steady ones."""
    if not steady:
        monkeypatch.setattr(scheduler_module, "steady_row", lambda *args: None)
    plan = compile_file(str(ROOT / "graphs/smollm2.yaml"), Options(preset="tiny")).plan
    config = ConductorConfig(plan_path="null", scheduler=SchedulerConfig(max_batch_tokens=max_batch_tokens,
                                                                            prefill_chunk_tokens=0))
    loop = asyncio.new_event_loop()
    rng = random.Random(7)
    try:
        conductor = Conductor(plan, config)
        workers = LengthWorkers(conductor, kv_blocks)
        reqs, steady_rows = [], 0

        def submit() -> None:
            prompt = [rng.randrange(1, 500) for _ in range(rng.randrange(1, longest_prompt + 1))]
            max_tokens, stop = rng.randrange(1, 40), rng.randrange(0, 3)
            # a stop id the KV length reaches after `stop * 7` tokens, for about a third of them
            stops = frozenset({len(prompt) + 7 * stop}) if stop else frozenset()
            poisoned = rng.random() < 0.05
            params = RequestParams(declared={"max_tokens": max_tokens},
                                   sampling=SamplingParams(top_k=POISON if poisoned else 0))
            reqs.append(conductor.submit("chat", params, [("text", prompt)], stop_token_ids=stops))

        async def drive() -> None:
            nonlocal steady_rows
            for step in range(2000):
                if step % 4 == 0 and len(reqs) < REQUESTS:
                    for _ in range(rng.randrange(1, WAVE)):
                        submit()
                if len(reqs) >= REQUESTS and all(r.state.is_final for r in reqs):
                    return
                await conductor.step()
                steady_rows += sum(1 for r in conductor.requests.values() if r.steady is not None)
            raise AssertionError("the requests did not end in 2000 steps")
        loop.run_until_complete(drive())
        outcome = [(r.request_id, r.state.name, r.finish_reason, r.output_ids, r.produced, r.kv_history, r.values)
                   for r in reqs]
        pool = conductor.ledger.pools[(0, "lm")]
        counts = {"used": pool.used_blocks, "peak": pool.peak_blocks, "preemptions": conductor.scheduler.preemptions,
                  "split": conductor.split_batches}
        return workers.sent, outcome, counts, steady_rows
    finally:
        loop.close()


def test_steady_rows_send_and_answer_exactly_as_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # 192 tokens of KV for waves of requests of up to 29 + 39 tokens: preemptions, held admissions
    sent, outcome, counts, steady_rows = run(True, monkeypatch, kv_blocks=12, max_batch_tokens=20, longest_prompt=29)
    with monkeypatch.context() as m:
        sent_general, outcome_general, counts_general, no_rows = run(False, m, 12, 20, 29)
    assert no_rows == 0 and steady_rows >= 100    # the reference made none; this run kept ~1,270 request-steps
    # the scenario reaches the ways a steady row ends: a preemption, a batch failing (its requests
    # retry alone), loops ending by length and by a stop id
    assert counts["preemptions"] > 0 and counts["split"] > 0 and {"length", "stop", "error"} <= {o[2] for o in outcome}
    assert outcome == outcome_general
    assert counts == counts_general and counts["used"] == 0
    assert sent == sent_general
    # and the answers are the ones a KV length gives: prompt + each token fed so far
    finished = [o for o in outcome if o[1] == "FINISHED"]
    assert finished and all(o[3] == list(range(o[3][0], o[3][0] + len(o[3]))) for o in finished)
