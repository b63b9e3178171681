"""One `mstar-run` as a real subprocess: compile a graph of this checkout, start it, talk HTTP to it.

    plan = compile_plan(Path("/tmp"), "smollm2", preset="tiny")
    srv = Server(plan, env={"OMP_NUM_THREADS": "1"})
    srv.wait_ready()
    http("GET", srv.url + "/v1/models")
    srv.stop()
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file

REPO = Path(__file__).resolve().parents[2]   # the checkout: graphs/ and the runtime package live here


def compile_plan(tmp: Path, graph: str, preset: str | None = None, placement: str | None = None,
                 quant: dict[str, str] | None = None) -> str:
    """graphs/<graph>.yaml compiled into `tmp` (`quant`: node -> scheme, as `mstarc compile --quant`); the plan.bin's
    path."""
    quantized = "-".join(f"{n}.{s}" for n, s in sorted((quant or {}).items()))
    out = tmp / f"{graph}-{preset or 'default'}-{placement or 'default'}{'-' + quantized if quant else ''}.plan.bin"
    options = Options(preset=preset, placement=placement, quant=dict(quant or {}))
    out.write_bytes(compile_file(str(REPO / "graphs" / f"{graph}.yaml"), options).data)
    return str(out)


def http(method: str, url: str, body: object | bytes | None = None, timeout: float = 60,
         headers: dict | None = None) -> tuple[int, dict | str]:
    """(status, JSON body, or the text when it is not JSON); an HTTP error status is returned, not raised."""
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


def process_tree(root: int) -> list[int]:
    """`root` and every process descending from it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def peak_rss(root: int) -> int:
    """The largest lifetime peak resident set (VmHWM, bytes) among `root` and its descendants (0: none read)."""
    peaks = []
    for pid in process_tree(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:       # exited meanwhile
            continue
        peaks += [int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")]
    return max(peaks, default=0)


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
        self.proc = subprocess.Popen([*(command or [sys.executable, "-m", "runtime.entrypoints.cli"]), plan, "--port", "0",
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

    def peak_rss(self) -> int:
        """The largest lifetime peak resident set (VmHWM, bytes) among the server's processes: its workers'."""
        return peak_rss(self.proc.pid)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
