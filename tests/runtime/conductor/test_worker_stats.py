"""What a real conductor (SmolLM2 tiny plan, no workers) shows on /metrics of each rank's holdings: from the
rank's Ready on, whatever order its heartbeats arrive in, and nothing of a dead worker's."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import pytest
import zmq

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.conductor import Conductor
from runtime.conductor.config import ConductorConfig
from runtime.entrypoints.http.audio_metrics import RuntimeCollector
from runtime.ranks.workers import WorkerSet
from runtime.transport.keys import ClusterKeys, start_guard, write_cluster_keys
from runtime.transport.messages import Heartbeat, NodeInfo, Ready
from runtime.transport.queues import Envelope
from tests.runtime.serving.conftest import REPO


@pytest.fixture
def conductor(tmp_path: Path) -> Iterator[Conductor]:
    plan = compile_file(str(REPO / "graphs" / "smollm2.yaml"), Options(preset="tiny")).plan
    conductor = Conductor(plan, ConductorConfig(plan_path="plan.bin"))
    conductor.workers = WorkerSet("plan.bin", "tcp://none", len(plan.ranks), set(), None, "info")
    conductor._send = lambda rank, msg, tensors=None: True         # no worker listens
    write_cluster_keys(tmp_path / "keys", 1)
    ctx = zmq.Context()
    conductor.guard = start_guard(ctx, ClusterKeys.load(f"{tmp_path}/keys/server.json"))   # Ready hands out its keys
    yield conductor
    conductor.guard.stop()
    ctx.term()


def _hear(conductor: Conductor, msg: object) -> None:
    asyncio.run(conductor._apply((0, Envelope(msg=msg))))


def _kv_gauges(conductor: Conductor) -> dict[tuple[str, str], float]:
    kv = next(f for f in RuntimeCollector(conductor).collect() if f.name == "mstar_worker_kv_used_blocks")
    return {(s.labels["rank"], s.labels["node"]): s.value for s in kv.samples}


def test_the_kv_gauges_are_there_from_ready_on_though_an_earlier_beat_arrives_after_it(conductor) -> None:
    starting = Heartbeat(rank=0, start_steps=3, start_last="loading lm", counted=False)
    held = Heartbeat(rank=0, start_steps=4, start_last="ready", kv_used_blocks={"lm": 0})
    _hear(conductor, starting)
    assert _kv_gauges(conductor) == {}                      # loading: nothing known yet
    _hear(conductor, Ready(rank=0, nodes=[NodeInfo(name="lm", kind="decoder_lm", weight_source="seed:0",
                                                   kv_blocks=64, kv_block_size=16)], held=held))
    assert _kv_gauges(conductor) == {("0", "lm"): 0}
    _hear(conductor, starting)                               # sent before Ready, on the heartbeat's own socket
    assert _kv_gauges(conductor) == {("0", "lm"): 0}
    _hear(conductor, Heartbeat(rank=0, start_steps=4, kv_used_blocks={"lm": 5}))
    assert _kv_gauges(conductor) == {("0", "lm"): 5}
    _hear(conductor, Heartbeat(rank=0, start_steps=4, counted=False))   # its tables kept changing under the read
    assert _kv_gauges(conductor) == {("0", "lm"): 5}


def test_a_dead_workers_holdings_leave_with_it(conductor) -> None:
    _hear(conductor, Heartbeat(rank=0, kv_used_blocks={"lm": 5}))
    conductor.workers.restart = lambda rank: None            # no process to start here
    conductor._rank_died(0)
    assert _kv_gauges(conductor) == {}
    _hear(conductor, Heartbeat(rank=0, start_steps=1, counted=False))   # its successor, loading
    assert _kv_gauges(conductor) == {}
