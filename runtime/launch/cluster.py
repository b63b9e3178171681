"""A plan served across hosts: the server (HTTP, conductor and rank 0) on host 0 of a `Network`,
each other rank a remote `mstar-run worker` on a host of its own, joined with its CURVE key
over the veths. Everything that crosses a rank boundary crosses a veth.

    keys = keygen(tmp, num_ranks=3)
    cluster = Cluster(net, plan, keys, hosts={1: 1, 2: 2})
    cluster.wait_ready()
    cluster.http("GET", "/v1/models")        # a client on host 0, as one on that host would be
    cluster.stop()

Every process runs torch on one thread (a second one spin-waits on a shared 2-core machine).
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from runtime.launch.netns import Network
from runtime.launch.server import REPO, http

if TYPE_CHECKING:
    import openai

_PORTS = itertools.count(8000, 2)   # fresh namespaces: every port is free; two clusters never share one
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
T = TypeVar("T")


class Cluster:
    """One plan: server on host 0, rank r > 0 on host `hosts[r]`."""

    def __init__(self, net: Network, plan: str, keys: Path, hosts: dict[int, int], *extra: str,
                 log: Path | None = None) -> None:
        self.net, self.plan, self.keys, self.hosts = net, plan, keys, hosts
        self.log = log                         # the server's stderr goes here when given
        port = next(_PORTS)
        self.url = f"http://{net.address(0)}:{port}"
        self.conductor = f"tcp://{net.address(0)}:{port + 1}"
        remote = ",".join(str(r) for r in sorted(hosts))
        self.server = net.popen(0, [sys.executable, "-m", "runtime.entrypoints.cli", plan, "--host", net.address(0),
                                    "--port", str(port), "--worker-endpoint", self.conductor,
                                    "--remote-ranks", remote, "--keys", str(keys), "--log-level", "warning", *extra],
                                cwd=REPO, env=ENV, stderr=None if log is None else log.open("w"))
        self.flags: dict[int, tuple[str, ...]] = {}   # rank -> the extra flags its worker was started with
        self.workers = {rank: self.start_worker(rank) for rank in hosts}

    def start_worker(self, rank: int, *flags: str) -> subprocess.Popen:
        """`mstar-run worker` of `rank` on its host (more `flags` for it); without `--host`/`--advertise`
        it finds its own address: the route to the conductor."""
        self.flags[rank] = flags
        return self.net.popen(self.hosts[rank], [
            sys.executable, "-m", "runtime.entrypoints.cli", "worker", "--conductor", self.conductor, "--rank", str(rank),
            "--key", str(self.keys / f"rank-{rank}.json"), "--threads", "1", "--log-level", "warning",
            *flags, self.plan],
            cwd=REPO, env=ENV)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args) as a client on host 0."""
        return self.net.call(0, fn, *args, **kwargs)

    def http(self, method: str, path: str, body: object = None, timeout: float = 60) -> tuple[int, Any]:
        return self.call(http, method, self.url + path, body, timeout)

    def client(self) -> openai.OpenAI:
        """An openai client for this server (the `openai` package of the test extra); use it only
        inside `call` (its sockets open there)."""
        import openai
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"mstar-run exited with {self.server.returncode}")
            try:
                if self.http("GET", "/health", timeout=2)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.3)
        raise TimeoutError("the cluster did not become healthy")

    def veth_bytes(self) -> int:
        """Bytes host 0's eth0 sent plus received: everything between the server's host and the ranks."""
        rx, tx = self.net.counters(0)
        return rx + tx

    def stop(self) -> int:
        self.server.terminate()
        try:
            code = self.server.wait(30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            code = self.server.wait()
        for proc in self.workers.values():
            try:
                proc.wait(10)    # told to shut down by the server
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return code


def keygen(tmp: Path, num_ranks: int) -> Path:
    """`mstar-run keygen` of `num_ranks` CURVE key pairs into tmp/keys; that folder."""
    out = tmp / "keys"
    subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "keygen", "--ranks", str(num_ranks), "--out", str(out)],
                   check=True, cwd=REPO, env=ENV, capture_output=True)
    return out
