"""The namespace harness itself: hosts reach each other over the veth and only there, counters count,
a cut link drops traffic until restored, and nothing is left behind."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.netns import Network, network, require_netns  # noqa: F401  (fixture)

# A one-shot TCP echo: host 0 listens, host 1 connects; the payload is big enough to see in counters.
LISTEN = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000)); s.listen(); print("ready", flush=True)
c, _ = s.accept(); n = 0
while (b := c.recv(65536)): n += len(b)
print(n, flush=True)
"""
SEND = """
import socket, sys
s = socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])); s.sendall(b"x" * 200_000); s.close()
"""


def _send(net: Network, src: int, dst: int, timeout: float = 5) -> subprocess.CompletedProcess:
    return net.run(src, [sys.executable, "-c", SEND, net.address(dst), str(timeout)], timeout=timeout + 10)


def test_hosts_talk_over_the_veth_and_counters_see_it(network: Network) -> None:
    server = network.popen(0, [sys.executable, "-c", LISTEN, network.address(0)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    rx0, _ = network.counters(0)
    _, tx1 = network.counters(1)
    assert _send(network, 1, 0).returncode == 0
    assert server.stdout.readline().strip() == "200000"
    assert network.counters(0)[0] - rx0 >= 200_000, "host 0's eth0 received the payload"
    assert network.counters(1)[1] - tx1 >= 200_000, "host 1's eth0 sent it"
    assert network.counters(2)[1] < 10_000, "host 2 took no part (only neighbour discovery)"


def test_call_runs_this_process_code_inside_a_host(network: Network) -> None:
    server = network.popen(0, [sys.executable, "-c", LISTEN, network.address(0)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"

    def send() -> None:
        with socket.create_connection((network.address(0), 7000), timeout=5) as s:
            s.sendall(b"y" * 1000)

    network.call(2, send)
    assert server.stdout.readline().strip() == "1000"
    assert network.counters(2)[1] >= 1000, "it left through host 2's eth0"


def test_a_cut_link_drops_traffic_until_restored(network: Network) -> None:
    server = network.popen(0, [sys.executable, "-c", LISTEN, network.address(0)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    network.cut(1)
    assert _send(network, 1, 0, timeout=1).returncode != 0, "host 1 cannot reach host 0 while cut"
    network.restore(1)
    assert _send(network, 1, 0).returncode == 0
    assert server.stdout.readline().strip() == "200000"


def test_nothing_is_left_behind_even_on_failure() -> None:
    require_netns()
    with pytest.raises(RuntimeError, match="boom"):
        with Network(2) as net:
            proc = net.popen(1, [sys.executable, "-c", "import time; time.sleep(600)"])
            names = [net.switch, *net.hosts]
            raise RuntimeError("boom")
    assert proc.poll() is not None, "the process started inside the namespace was ended"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names), listed
