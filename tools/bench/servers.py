"""Start and stop an HTTP model server (mstar-run, vLLM's api_server) for one suite.

A `Server` is a context manager: it starts the command in its own process group with its
output in a log file, waits until `GET <health_path>` answers 200, and on exit sends
SIGTERM to that group (SIGKILL after a grace period). Nothing else is ever signalled.
mstar-run binds a port the system picks (`--port 0`) and writes it to a file once it serves
(`--port-file`), so no port is chosen here and bound there (another process, a worker's
socket, could take it in between); vLLM's server has no such flag and gets a free port.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from bench.registry import Needs
from runtime.transport import addresses


def free_port() -> int:
    """A loopback port for a peer server that must be told its port (outside the kernel's ephemeral range)."""
    return addresses.free_port("127.0.0.1")


# environment tools/bench.py set for its in-process sides (a worker's OpenMP wait policy), which no server
# inherits: each starts with its own defaults (mstar-run's workers set the same policy themselves, vLLM keeps
# libgomp's). Until 2026-12-02 every server inherited OMP_WAIT_POLICY=PASSIVE from here, vLLM included.
BENCH_SET: set[str] = set()


class Server:
    """One server process: `with Server(...) as srv: srv.url`."""

    def __init__(self, name: str, cmd: Sequence[str], port: int, log_path: Path,
                 env: Mapping[str, str] | None = None, health_path: str = "/health",
                 start_timeout_s: float = 600.0, port_file: Path | None = None) -> None:
        self.name, self.cmd, self.port, self.log_path = name, list(cmd), port, log_path
        self.port_file = port_file     # where the server writes the port it bound (port is 0 until then)
        inherited = {k: v for k, v in os.environ.items() if k not in BENCH_SET}
        self.env = {**inherited, **(env or {})}
        self.health_path, self.start_timeout_s = health_path, start_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("w")
        if self.port_file is not None:
            self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Needs(f"{self.name} exited with {self.proc.returncode} while starting; "
                            f"see {self.log_path}: {self._log_tail()}")
            if self.port_file is not None and not self.port:
                if not self.port_file.is_file():
                    time.sleep(1.0)
                    continue
                self.port = int(self.port_file.read_text())   # written whole, once serving
            try:
                with urllib.request.urlopen(self.url + self.health_path, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.__exit__(None, None, None)
        raise Needs(f"{self.name} did not answer {self.health_path} within {self.start_timeout_s:.0f} s; "
                    f"see {self.log_path}")

    def _log_tail(self, n: int = 400) -> str:
        try:
            return self.log_path.read_text()[-n:].replace("\n", " | ")
        except OSError:
            return ""

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def mstar_run(plan: Path, log_path: Path, name: str, threads: int | None = None, *flags: str,
              start_timeout_s: float = 600.0) -> Server:
    """`mstar-run plan [flags]` on a port it binds itself (module docstring); `threads` becomes
    OMP_NUM_THREADS, which the server hands its local workers as `--threads`."""
    port_file = log_path.with_suffix(".port")
    cmd = [str(Path(sys.executable).parent / "mstar-run"), str(plan), "--port", "0", "--port-file", str(port_file),
           "--log-level", "warning", *flags]
    return Server(name, cmd, 0, log_path, {} if threads is None else {"OMP_NUM_THREADS": str(threads)},
                  start_timeout_s=start_timeout_s, port_file=port_file)
