"""The ranks as the conductor sees them: local worker processes it starts, watches and restarts,
and remote workers that join by themselves (`mstar-run worker --conductor tcp://HOST:PORT`).

A rank is alive while its heartbeats arrive; a local rank is also dead the moment its
process exits. The conductor polls `dead_ranks()` and restarts local ones with `restart()`;
a remote one is given up (`is_given_up`) until it speaks again, then asked to rejoin.
Local workers bind and advertise the server's `--host` (loopback by default), so what they
announce is what ranks on other hosts can dial when the server listens on a network address.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

from runtime.transport.messages import NodeInfo
from runtime.weights.sources import WeightOptions

log = logging.getLogger(__name__)
HEARTBEAT_TIMEOUT_S = 5.0


@dataclass
class RankStatus:
    """What the conductor knows about one rank's worker."""

    rank: int
    is_local: bool
    process: subprocess.Popen | None = None
    pid: int = 0
    peer_endpoint: str = ""
    tp_port: int = 0               # lead of a TP group: the port it reserved for the rendezvous
    is_welcomed: bool = False      # the conductor has answered this process's Hello
    is_given_up: bool = False      # a remote rank declared dead whose worker has not said Hello since
    asked_to_rejoin_at: float = 0.0  # when a given-up remote rank that spoke again was last sent Rejoin
    is_ready: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    nodes: list[NodeInfo] = field(default_factory=list)
    restarts: int = 0


class WorkerSet:
    """Every rank of the plan; starts the local ones as `mstar-run worker` subprocesses."""

    def __init__(self, plan_path: str, endpoint: str, num_ranks: int, remote: set[int],
                 weights: WeightOptions, log_level: str, key_files: dict[int, str] | None = None,
                 host: str = "127.0.0.1") -> None:
        self.plan_path = plan_path
        self.host = host   # the server's --host: where local workers bind and what they advertise
        self.key_files = key_files or {}   # rank -> its 0600 key file (the path travels in argv, not the key)
        self.endpoint = endpoint
        self.weights = weights
        self.log_level = log_level
        self.ranks = {r: RankStatus(r, is_local=r not in remote) for r in range(num_ranks)}

    def start_local(self) -> None:
        for status in self.ranks.values():
            if status.is_local:
                self._spawn(status)

    def _spawn(self, status: RankStatus) -> None:
        cmd = [sys.executable, "-m", "runtime.cli", "worker", "--conductor", self.endpoint,
               "--rank", str(status.rank), "--host", self.host, "--log-level", self.log_level, self.plan_path]
        cmd += self.weights.cli_args()
        if status.rank in self.key_files:
            cmd += ["--key", self.key_files[status.rank]]
        cmd += ["--threads", str(self.threads_per_worker())]
        status.process = subprocess.Popen(cmd)
        status.is_ready = False
        status.last_seen = time.monotonic()

    def threads_per_worker(self) -> int:
        return threads_per_local_worker(sum(1 for s in self.ranks.values() if s.is_local))

    def dead_ranks(self) -> list[int]:
        now = time.monotonic()
        dead = []
        for status in self.ranks.values():
            exited = status.process is not None and status.process.poll() is not None
            silent = status.pid and now - status.last_seen > HEARTBEAT_TIMEOUT_S
            if exited or silent:
                dead.append(status.rank)
        return dead

    def restart(self, rank: int) -> None:
        """Forget the rank's process; start a fresh one if it is local."""
        status = self.ranks[rank]
        if status.process is not None and status.process.poll() is None:
            status.process.kill()
        status.process, status.pid, status.is_ready, status.is_welcomed = None, 0, False, False
        status.tp_port, status.asked_to_rejoin_at = 0, 0.0
        status.is_given_up = not status.is_local
        if status.is_local:
            status.restarts += 1
            log.warning("restarting worker of rank %d (restart %d)", rank, status.restarts)
            self._spawn(status)

    def ready_ranks(self) -> set[int]:
        return {r for r, s in self.ranks.items() if s.is_ready}

    def stop(self, timeout: float = 5.0) -> None:
        for status in self.ranks.values():
            if status.process is not None:
                try:
                    status.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    status.process.kill()
                    status.process.wait()


def threads_per_local_worker(num_local: int) -> int:
    """Torch threads for each of `num_local` workers on this host: an equal share of the cores
    (more threads than cores make torch's intra-op threads spin-wait on each other, and a tiny
    matmul then takes milliseconds instead of microseconds). OMP_NUM_THREADS, when set, is the
    user's choice."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, (os.cpu_count() or 1) // max(1, num_local))
