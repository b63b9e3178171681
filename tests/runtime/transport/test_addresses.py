"""What a worker binds and advertises, on loopback and on a host of a namespace network, and the
errors a rank gets when a peer's address does not answer."""
from __future__ import annotations

import socket

import pytest
import zmq

from runtime.transport import queues
from runtime.transport.addresses import interface_of, probe, route_address, worker_addresses
from runtime.transport.messages import EdgeTensors
from tests.netns import Network, network  # noqa: F401  (fixture)


def test_explicit_addresses_win() -> None:
    assert worker_addresses("tcp://127.0.0.1:5555", None, None) == ("127.0.0.1", "127.0.0.1")
    assert worker_addresses("tcp://127.0.0.1:5555", "127.0.0.2", None) == ("127.0.0.2", "127.0.0.2")
    assert worker_addresses("tcp://127.0.0.1:5555", "0.0.0.0", "203.0.113.7") == ("*", "203.0.113.7")
    assert worker_addresses("tcp://0.0.0.0:5555", "0.0.0.0", None) == ("*", "127.0.0.1")


def test_a_worker_on_another_host_advertises_the_interface_that_reaches_the_conductor(network: Network) -> None:
    conductor = f"tcp://{network.address(0)}:5555"
    assert network.call(1, worker_addresses, conductor, None, None) == (network.address(1), network.address(1))
    assert network.call(2, interface_of, network.address(2)) == "eth0"
    with pytest.raises(OSError, match="no route from this host to the conductor at 192.0.2.1"):
        network.call(1, route_address, "192.0.2.1")   # the namespaces route only their /24


def test_probe_says_why_and_after_how_long(network: Network) -> None:
    network.cut(1)
    reason = network.call(0, probe, f"tcp://{network.address(1)}:7000", 0.5)
    assert reason is not None and "after 0." in reason, reason
    network.restore(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert probe(f"tcp://127.0.0.1:{s.getsockname()[1]}") is None


def test_a_push_to_a_peer_that_never_answers_fails_naming_it(monkeypatch) -> None:
    monkeypatch.setattr(queues, "PUSH_TIMEOUT_S", 0.5)
    with socket.socket() as s:      # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = zmq.Context()
    outbox = queues.EdgeOutbox(ctx)
    outbox.set_peers({3: dead})
    # the send gives up after PUSH_TIMEOUT_S (the socket's send timeout), and says so: not a 30 s input wait
    with pytest.raises(queues.PeerUnreachableError, match=f"rank 3 at {dead} took no connection within 0.5 s"):
        outbox.send(3, EdgeTensors(request_id=1, tensors=[]))
    outbox.close()
    ctx.term()
