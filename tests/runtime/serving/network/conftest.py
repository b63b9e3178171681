"""A plan served across hosts: the server (HTTP, conductor and rank 0) in network namespace 0,
each other rank a remote `mstar-run worker` in a namespace of its own, joined with its CURVE key
over the veths of runtime/launch/netns.py (`Cluster`: runtime/launch/cluster.py). Everything that
crosses a rank boundary crosses a veth.

The test talks to the server from inside host 0 (`Network.call`), as a client on that host would.
Workers run torch on one thread (a second one spin-waits on a shared 2-core machine).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from runtime.launch.cluster import Cluster, keygen
from tests.netns import Network, make_network


def serve_across(net: Network, tmp: Path, plan: str, hosts: dict[int, int], *extra: str,
                 log: Path | None = None) -> Iterator[Cluster]:
    """A module fixture's body: the cluster, ready, stopped cleanly (status 0) at the end."""
    cluster = Cluster(net, plan, keygen(tmp, 1 + len(hosts)), hosts, *extra, log=log)
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        assert cluster.stop() == 0


@pytest.fixture(scope="module")
def net() -> Iterator[Network]:
    """Three hosts for the module's clusters (10.201.0.1-3)."""
    yield from make_network(3)
