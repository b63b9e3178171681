"""The join handshake, conductor side: one TP rendezvous for the whole group (the lead's address
and reserved port, whoever says Hello first), loopback/network address mixes named, and a
given-up remote rank asked to rejoin until its Hello comes."""
from __future__ import annotations

import logging
import time
from pathlib import Path

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.plan import loads_plan
from runtime.ranks import joining as joining_module
from runtime.ranks.joining import Joining
from runtime.ranks.workers import WorkerSet
from runtime.transport.messages import Hello, Rejoin, Welcome

REPO = Path(__file__).resolve().parents[3]


def joining(placement: str, remote: set[int]) -> tuple[Joining, list[tuple[int, object]]]:
    plan = loads_plan(compile_file(str(REPO / "graphs/orpheus.yaml"), Options(preset="tiny", placement=placement)).data)
    sent: list[tuple[int, object]] = []
    workers = WorkerSet("plan.bin", "tcp://fake", len(plan.ranks), remote, None, "info")
    return Joining(plan, workers, lambda rank, msg: sent.append((rank, msg)) or True), sent


def test_the_tp_group_meets_at_its_lead_whoever_says_hello_first() -> None:
    join, sent = joining("tp2", remote={1})
    join.hello(1, Hello(rank=1, pid=11, peer_endpoint="tcp://10.0.0.2:4000"))
    assert sent == [], "the follower waits for the lead's port"
    join.hello(0, Hello(rank=0, pid=10, peer_endpoint="tcp://10.0.0.1:4001", tp_port=29123))
    assert sorted(sent, key=lambda s: s[0]) == [(0, Welcome(tp_init="tcp://10.0.0.1:29123")),
                                                (1, Welcome(tp_init="tcp://10.0.0.1:29123"))]


def test_a_rank_without_a_group_is_welcomed_at_once() -> None:
    join, sent = joining("disaggregated", remote={1})
    join.hello(1, Hello(rank=1, pid=11, peer_endpoint="tcp://10.0.0.2:4000"))
    assert sent == [(1, Welcome())]


def test_loopback_beside_a_network_address_is_named(caplog) -> None:
    join, _ = joining("disaggregated", remote={1})
    with caplog.at_level(logging.ERROR):
        join.hello(0, Hello(rank=0, pid=10, peer_endpoint="tcp://127.0.0.1:4001"))
        join.hello(1, Hello(rank=1, pid=11, peer_endpoint="tcp://10.0.0.2:4000"))
    assert "rank 0 advertises tcp://127.0.0.1:4001, a loopback address, but rank 1 is at tcp://10.0.0.2:4000" \
        in caplog.text
    assert "--host ADDRESS" in caplog.text


def test_a_given_up_rank_is_asked_to_rejoin_until_it_says_hello(monkeypatch) -> None:
    join, sent = joining("disaggregated", remote={1})
    clock = iter([100.0, 100.5, 103.0, 104.0])
    monkeypatch.setattr(joining_module.time, "monotonic", lambda: next(clock))
    join.workers.restart(1)          # what the conductor does when rank 1 falls silent
    assert join.workers.ranks[1].is_given_up
    join.ask_to_rejoin(1)            # t=100: asked
    join.ask_to_rejoin(1)            # t=100.5: within REJOIN_RETRY_S, not again
    join.ask_to_rejoin(1)            # t=103: no Hello yet (the first was lost): asked again
    assert sent == [(1, Rejoin()), (1, Rejoin())]
    join.hello(1, Hello(rank=1, pid=11, peer_endpoint="tcp://10.0.0.2:4000"))
    assert not join.workers.ranks[1].is_given_up


def test_a_rejoin_that_found_no_connection_is_asked_again() -> None:
    join, sent = joining("disaggregated", remote={1})
    answers = iter([False, True])   # its heartbeat socket came back before its control socket
    join.send = lambda rank, msg: sent.append((rank, msg)) or next(answers)
    join.workers.restart(1)
    for _ in range(3):
        join.ask_to_rejoin(1)
    assert sent == [(1, Rejoin()), (1, Rejoin())]


def test_a_loading_rank_is_judged_by_its_silence_only_after_the_loading_timeout() -> None:
    """A rank not yet Ready may hold the GIL for seconds while it builds its parts (its heartbeats stall):
    silence past HEARTBEAT_TIMEOUT_S kills a ready rank, a loading one only past LOADING_TIMEOUT_S."""
    from runtime.ranks.workers import HEARTBEAT_TIMEOUT_S, LOADING_TIMEOUT_S
    workers = WorkerSet("plan.bin", "tcp://fake", 2, {0, 1}, None, "info")
    now = time.monotonic()
    for status in workers.ranks.values():
        status.pid, status.last_seen = 100 + status.rank, now - HEARTBEAT_TIMEOUT_S - 1
    workers.ranks[1].is_ready = True
    assert workers.dead_ranks() == [1], "the ready rank is dead, the loading one is not"
    workers.ranks[0].last_seen = now - LOADING_TIMEOUT_S - 1
    assert workers.dead_ranks() == [0, 1]
