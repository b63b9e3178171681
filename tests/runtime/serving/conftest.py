"""Factories for serving tests: compile a graph, start a real `mstar-run` subprocess, talk HTTP."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.transport import addresses

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    """A loopback port free now, for the tests that must name one in advance (a worker endpoint, a gloo
    rendezvous): picked as the runtime picks its TP rendezvous port, outside the kernel's ephemeral range."""
    return addresses.free_port("127.0.0.1")


def compile_plan(tmp: Path, graph: str, preset: str | None = None, placement: str | None = None) -> str:
    out = tmp / f"{graph}-{preset or 'default'}-{placement or 'default'}.plan.bin"
    out.write_bytes(compile_file(str(REPO / "graphs" / f"{graph}.yaml"), Options(preset=preset, placement=placement)).data)
    return str(out)


def http(method: str, url: str, body: object | bytes | None = None, timeout: float = 60,
         headers: dict | None = None) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


class Server:
    """A real `mstar-run` process on a port the system picks when it binds (`--port 0 --port-file`):
    a port picked here and handed over could be taken meanwhile (another server's worker sockets
    bind ephemeral ports too), and that server then fails to start."""

    def __init__(self, plan: str, *extra: str, env: dict | None = None, command: list[str] | None = None,
                 cwd: str | Path = REPO) -> None:
        fd, self._port_file = tempfile.mkstemp(prefix="mstar-port-")
        os.close(fd)
        os.unlink(self._port_file)      # it appears once the server listens
        self._port: int | None = None
        self.proc = subprocess.Popen([*(command or [sys.executable, "-m", "runtime.cli"]), plan, "--port", "0",
                                      "--port-file", self._port_file, "--log-level", "warning", *extra],
                                     cwd=cwd, env={**os.environ, **(env or {})})

    @property
    def port(self) -> int:
        if self._port is None:
            try:
                self._port = int(Path(self._port_file).read_text())
            except FileNotFoundError:
                raise RuntimeError("mstar-run is not listening yet: wait_ready() first") from None
            os.unlink(self._port_file)
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mstar-run exited with {self.proc.returncode}")
            if self._port is None and not os.path.exists(self._port_file):
                time.sleep(0.2)
                continue
            try:
                if http("GET", f"{self.url}/health", timeout=2)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise TimeoutError("mstar-run did not become healthy")

    def metric(self, name: str) -> float:
        _, text = http("GET", f"{self.url}/metrics")
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def wait_metric(self, name: str, timeout: float = 30) -> float:
        """`metric(name)` once the server exports it (a worker's gauges come with its heartbeats)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.metric(name)
            except KeyError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plans")


def serve_tiny(tmp_path_factory: pytest.TempPathFactory, graph: str, placement: str = "single",
               *extra: str, timeout: float = 120) -> Iterator[Server]:
    """A module-scoped server of `graph`'s tiny preset; its workers run torch on one thread
    (OMP_NUM_THREADS is passed on: a second thread spin-waits on a shared 2-core machine)."""
    plan = compile_plan(tmp_path_factory.mktemp(graph), graph, preset="tiny", placement=placement)
    srv = Server(plan, *extra, env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(timeout)
        yield srv
    finally:
        assert srv.stop() == 0


def serve(plan_path: str, *extra: str, timeout: float = 180) -> Iterator[Server]:
    """A real `mstar-run` of `plan_path` for a fixture to yield from, torch on one thread (a second
    one spin-waits on 2 cores); it must exit cleanly (status 0) when the fixture ends."""
    srv = Server(plan_path, *extra, env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(timeout)
        yield srv
    finally:
        assert srv.stop() == 0
