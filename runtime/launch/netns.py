"""Several hosts on one machine: Linux network namespaces joined by veth pairs to one bridge.

    with Network(3) as net:                  # tests: the `network` fixture / `make_network(n)` of tests/netns.py
        srv = net.popen(0, [sys.executable, "-m", "runtime.entrypoints.cli", ...])   # runs inside host 0
        net.address(0)                       # "10.201.0.1"
        rx, tx = net.counters(1)             # bytes host 1's eth0 received and sent
        net.cut(1); net.restore(1)           # unplug / plug host 1's cable
        net.call(0, urllib.request.urlopen, "http://10.201.0.1:8000/health")   # this process, as host 0

Host i is namespace `<prefix>-h<i>` with `lo` up and `eth0` at `<subnet>.<i+1>/24`; the other end
of its veth is plugged into a bridge that lives in a namespace of its own (`<prefix>-sw`), so the
machine's own namespace gains no interface, no address and no route: nothing reaches outside.
Names carry the pid and a counter, so parallel runs never collide. Everything is torn down on exit,
failure included: processes started through `popen` are killed (by their pid), then any process still
inside a host namespace (a child they spawned), then the namespaces (which removes the veths).
`call` runs a function of the test itself on a thread moved into a host's namespace (setns is per
thread; sockets stay in the namespace they were made in), so a test's own HTTP client, the `openai`
one included, talks to a server inside a namespace without a subprocess.
`unavailable_reason()` says why the machine cannot do this (not root, no `ip netns`); tests skip with it.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

_COUNTER = itertools.count()
_CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the suite as root, as CI does)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"msprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done.stdout


class Network:
    """`num_hosts` namespaces on one bridge, addresses `<subnet>.1` … `<subnet>.N` (a /24)."""

    def __init__(self, num_hosts: int, subnet: str = "10.201.0") -> None:
        self.prefix = f"ms{os.getpid()}n{next(_COUNTER)}"
        self.subnet = subnet
        self.switch = f"{self.prefix}-sw"
        self.hosts = [f"{self.prefix}-h{i}" for i in range(num_hosts)]
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            _ip("netns", "add", host)
            _ip("-n", host, "link", "set", "lo", "up")
            # Both ends are made inside the namespaces, so the machine's own namespace never sees them.
            _ip("-n", self.switch, "link", "add", self.port(i), "type", "veth", "peer", "name", "eth0", "netns", host)
            _ip("-n", self.switch, "link", "set", self.port(i), "master", "br0", "up")
            _ip("-n", host, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def port(self, i: int) -> str:
        """The switch-side end of host i's cable (in the switch namespace)."""
        return f"p{i}"

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.hosts[i], *argv]

    def popen(self, i: int, argv: Sequence[str], **kwargs: object) -> subprocess.Popen:
        """Start `argv` inside host i (`ip netns exec` execs it, so the pid is the program's own)."""
        proc = subprocess.Popen(self.command(i, argv), **kwargs)  # type: ignore[call-overload]
        self._procs.append(proc)
        return proc

    def run(self, i: int, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(i, argv), capture_output=True, text=True, timeout=timeout)

    def call(self, i: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on a thread inside host i's namespace; its result, or its exception."""
        out: dict[str, Any] = {}

        def inside() -> None:
            try:
                _enter(f"/run/netns/{self.hosts[i]}")
                out["value"] = fn(*args, **kwargs)
            except BaseException as exc:   # handed to the caller's thread
                out["error"] = exc

        thread = threading.Thread(target=inside, name=f"in-{self.hosts[i]}")
        thread.start()
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["value"]

    def counters(self, i: int) -> tuple[int, int]:
        """(received, sent) bytes of host i's eth0 since it was made."""
        stats = json.loads(_ip("-n", self.hosts[i], "-s", "-j", "link", "show", "dev", "eth0"))[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def cut(self, i: int) -> None:
        """Unplug host i: its switch port goes down, so packets to and from it are dropped
        (its own eth0 stays up, as a host whose cable was pulled elsewhere sees nothing)."""
        _ip("-n", self.switch, "link", "set", self.port(i), "down")

    def restore(self, i: int) -> None:
        _ip("-n", self.switch, "link", "set", self.port(i), "up")

    def pids(self, i: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.hosts[i]], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill_host(self, i: int) -> None:
        """Kill every process inside host i (a host that lost power)."""
        for pid in self.pids(i):
            _signal(pid, signal.SIGKILL)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for proc in self._procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for i, host in enumerate(self.hosts):
            self.kill_host(i)
            subprocess.run(["ip", "netns", "del", host], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)


def _enter(path: str) -> None:
    """Move the calling thread into the network namespace at `path`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({path}) failed")
    finally:
        os.close(fd)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
