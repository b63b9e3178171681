"""Test fixtures over runtime/launch/netns.py (several hosts on one machine from network namespaces):
they skip, with the reason, where the machine cannot make namespaces (not root, no `ip netns`)."""
from __future__ import annotations

from typing import Iterator

import pytest

from runtime.launch.netns import Network, unavailable_reason


def require_netns() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def network() -> Iterator[Network]:
    """Three hosts, torn down after the test."""
    require_netns()
    with Network(3) as net:
        yield net


def make_network(num_hosts: int, subnet: str = "10.201.0") -> Iterator[Network]:
    """For a fixture of another scope: `yield from make_network(2)`."""
    require_netns()
    with Network(num_hosts, subnet) as net:
        yield net
