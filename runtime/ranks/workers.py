"""The ranks as the conductor sees them: local worker processes it starts, watches and restarts,
and remote workers that join by themselves (`mstar-run worker --conductor tcp://HOST:PORT`).

A rank is alive while its heartbeats arrive; a local rank is also dead the moment its
process exits. The conductor polls `dead_ranks()` and restarts local ones with `restart()`;
a remote one is given up (`is_given_up`) until it speaks again, then asked to rejoin.
Local workers bind and advertise the server's `--host` (loopback by default), so what they
announce is what ranks on other hosts can dial when the server listens on a network address.
A `RankLauncher` (runtime/ranks/ray: Ray actors) may start the local ranks elsewhere instead
of as subprocesses here; the set watches what it returns as it watches a process. Such a rank
makes its own CURVE pair where it runs; the set admits the public key it returns (and no
longer the key of the rank's previous process), so no secret is handed to a launcher.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.transport.keys import Admission
from runtime.transport.messages import NodeInfo
from runtime.model_executor.weights.sources import WeightOptions

log = logging.getLogger(__name__)
HEARTBEAT_TIMEOUT_S = 5.0
# A rank still loading (not yet Ready) may go silent for seconds: building a part can hold the GIL
# (torch.jit.script of SNAC's decoder: ~0.9 s without a beat on an idle 2-core machine, several times that
# beside other busy processes), so its heartbeat thread stalls. Its exit is seen at once; its silence
# counts only past this.
LOADING_TIMEOUT_S = 60.0


class RankProcess(Protocol):
    """What the set needs of a started worker: subprocess.Popen's poll / kill / wait."""

    def poll(self) -> int | None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int | None: ...   # raises subprocess.TimeoutExpired


@dataclass(frozen=True)
class RankLaunch:
    """Everything starting one rank's worker takes, wherever it runs."""

    rank: int
    conductor: str            # the conductor's worker endpoint
    plan_path: str            # plan.bin on this host
    key_file: str | None      # the rank's 0600 CURVE key file on this host (None: the rank makes its own pair)
    weights: WeightOptions
    log_level: str
    threads: int              # torch intra-op threads
    server_key: str = ""      # the conductor's CURVE public key (z85), for a rank that makes its own pair

    def argv(self, plan_path: str | None = None, key_file: str | None = None, host: str | None = None) -> list[str]:
        """`mstar-run worker` arguments; a launcher on another host passes its own copies' paths
        and the address its peers reach it at."""
        key = key_file or self.key_file
        return ["--conductor", self.conductor, "--rank", str(self.rank), "--log-level", self.log_level,
                *(["--key", key] if key else []), "--threads", str(self.threads),
                *(["--host", host] if host else []), *self.weights.cli_args(), plan_path or self.plan_path]


@dataclass(frozen=True)
class LaunchedRank:
    """What a launcher's `start` returns: the process to watch, and the public half of the CURVE pair
    the rank made where it runs (its secret stays there)."""

    process: RankProcess
    public_key: Future[bytes]    # z85; fails when the rank died before making it (then `process` ends too)


class RankLauncher(Protocol):
    """Starts local ranks somewhere else than as subprocesses of this process."""

    def start(self, launch: RankLaunch) -> LaunchedRank: ...
    def describe(self) -> dict[str, Any]: ...   # where each rank runs, for /v1/models
    def close(self) -> None: ...


@dataclass
class RankStatus:
    """What the conductor knows about one rank's worker."""

    rank: int
    is_local: bool
    process: RankProcess | None = None
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
    key: Future[bytes] | None = None   # a launcher rank's public key, not admitted yet


class WorkerSet:
    """Every rank of the plan; starts the local ones as `mstar-run worker` subprocesses."""

    def __init__(self, plan_path: str, endpoint: str, num_ranks: int, remote: set[int],
                 weights: WeightOptions, log_level: str, key_files: dict[int, str] | None = None,
                 host: str = "127.0.0.1", launcher: RankLauncher | None = None,
                 admission: Admission | None = None, server_key: bytes = b"") -> None:
        self.plan_path = plan_path
        self.host = host   # the server's --host: where local workers bind and what they advertise
        self.key_files = key_files or {}   # rank -> its 0600 key file (the path travels in argv, not the key)
        self.endpoint = endpoint
        self.weights = weights
        self.log_level = log_level
        self.ranks = {r: RankStatus(r, is_local=r not in remote) for r in range(num_ranks)}
        self.launcher = launcher
        self.admission = admission         # the conductor's guard: which key is which rank's
        self.server_key = server_key.decode()   # the conductor's public key, for ranks that make their own pair

    def start_local(self) -> None:
        for status in self.ranks.values():
            if status.is_local:
                self._spawn(status)

    def _spawn(self, status: RankStatus) -> None:
        launch = RankLaunch(status.rank, self.endpoint, self.plan_path, self.key_files.get(status.rank), self.weights,
                            self.log_level, self.threads_per_worker(), self.server_key)
        if self.launcher is not None:
            if self.admission is not None:    # the previous process's key (or a keygen one) no longer gets in
                self.admission.revoke(status.rank)
            launched = self.launcher.start(launch)   # the launcher's worker advertises its own node's address
            status.process, status.key = launched.process, launched.public_key
        else:
            # -P: a folder named runtime/ in the server's working directory must not shadow the package
            status.process = subprocess.Popen([sys.executable, "-P", "-m", "runtime.entrypoints.cli", "worker",
                                               *launch.argv(host=self.host)])
        status.is_ready = False
        status.last_seen = time.monotonic()

    def admit_keys(self) -> None:
        """Admit the public keys launcher ranks returned since the last call (polled by the conductor; a
        worker that dialled before is let in when it dials again, keys.py)."""
        for status in self.ranks.values():
            if status.key is not None and status.key.done():
                key, status.key = status.key, None
                if key.exception() is None and self.admission is not None:
                    self.admission.admit(status.rank, key.result())

    def threads_per_worker(self) -> int:
        return threads_per_local_worker(sum(1 for s in self.ranks.values() if s.is_local))

    def dead_ranks(self) -> list[int]:
        now = time.monotonic()
        dead = []
        for status in self.ranks.values():
            exited = status.process is not None and status.process.poll() is not None
            limit = HEARTBEAT_TIMEOUT_S if status.is_ready else LOADING_TIMEOUT_S
            silent = status.pid and now - status.last_seen > limit
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

    def exit_before_ready(self, rank: int) -> int | None:
        """The exit status of the rank's local worker if it exited before it was ready (else None)."""
        status = self.ranks[rank]
        return None if status.process is None or status.is_ready else status.process.poll()

    def remove_key_files(self) -> None:
        """Delete the ranks' key files and their folder (keys made for this start only)."""
        for path in self.key_files.values():
            os.remove(path)
        if self.key_files:
            os.rmdir(os.path.dirname(next(iter(self.key_files.values()))))

    def placement(self) -> dict[str, Any] | None:
        """Where the launcher put each rank, with the inbox address the rank advertises to its peers
        (None without a launcher)."""
        if self.launcher is None:
            return None
        out = self.launcher.describe()
        for rank, info in out["ranks"].items():
            info["inbox"] = self.ranks[int(rank)].peer_endpoint
        return out

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
        if self.launcher is not None:
            self.launcher.close()


def threads_per_local_worker(num_local: int) -> int:
    """Torch threads for each of `num_local` workers on this host: an equal share of the cores
    (more threads than cores make torch's intra-op threads spin-wait on each other, and a tiny
    matmul then takes milliseconds instead of microseconds). OMP_NUM_THREADS, when set, is the
    user's choice."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, (os.cpu_count() or 1) // max(1, num_local))
