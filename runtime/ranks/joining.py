"""How a worker joins: Hello -> Welcome (with its tensor-parallel rendezvous) -> load -> Ready.

The rendezvous of a TP group is decided here, once: the group's first rank reserves a port on
the address it advertises and says so in its Hello; every member's Welcome names
`tcp://<that address>:<that port>`, so ranks on several hosts meet at one place (members that
say Hello first wait for the lead's). Peer addresses are checked as they arrive: a rank on
loopback cannot be reached by a rank on another host, which is said at once, naming both.
A remote rank given up as dead that speaks again (a cable plugged back in) is sent Rejoin.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from mstar_compiler.plan import Plan
from runtime.ranks.workers import RankStatus, WorkerSet
from runtime.transport.addresses import endpoint_host, is_loopback
from runtime.transport.messages import Hello, PeerUnreachable, Rejoin, Welcome

log = logging.getLogger(__name__)
# Rejoin is asked again after this long without the rank's Hello: the first may have been queued on a
# connection that its heartbeat timeout then closed, or found the rank's control socket not back yet.
REJOIN_RETRY_S = 2.0


class Joining:
    """The conductor's side of the join handshake."""

    def __init__(self, plan: Plan, workers: WorkerSet, send: Callable[[int, Any], object]) -> None:
        self.plan = plan
        self.workers = workers
        self.send = send
        self.num_unreachable = 0   # PeerUnreachable reports received

    def hello(self, rank: int, msg: Hello) -> None:
        status = self.workers.ranks[rank]
        status.pid, status.peer_endpoint, status.tp_port = msg.pid, msg.peer_endpoint, msg.tp_port
        status.is_welcomed = status.is_given_up = False
        status.asked_to_rejoin_at = 0.0
        self._check_reachable(status)
        for other in self.workers.ranks.values():
            if other.pid and not other.is_welcomed:
                self._welcome(other)

    def _welcome(self, status: RankStatus) -> None:
        group = self.plan.tp_ranks(status.rank)
        if group is None:
            self.send(status.rank, Welcome())
        else:
            lead = self.workers.ranks[group[0]]
            if not lead.tp_port:
                return   # answered when the lead says Hello
            self.send(status.rank, Welcome(tp_init=f"tcp://{endpoint_host(lead.peer_endpoint)}:{lead.tp_port}"))
        status.is_welcomed = True

    def _check_reachable(self, joined: RankStatus) -> None:
        """Loopback and non-loopback addresses in one cluster: neither side can reach the other."""
        mine = endpoint_host(joined.peer_endpoint)
        for other in self.workers.ranks.values():
            theirs = endpoint_host(other.peer_endpoint) if other.peer_endpoint else None
            if other.rank == joined.rank or theirs is None or is_loopback(mine) == is_loopback(theirs):
                continue
            local, remote = (joined, other) if is_loopback(mine) else (other, joined)
            log.error("rank %d advertises %s, a loopback address, but rank %d is at %s: rank %d cannot push to "
                      "rank %d. Start the server with --host ADDRESS (local workers bind it) or the worker with "
                      "--advertise ADDRESS, an address the other host reaches", local.rank, local.peer_endpoint,
                      remote.rank, remote.peer_endpoint, remote.rank, local.rank)

    def unreachable(self, msg: PeerUnreachable) -> str:
        """Log a rank's report that a peer does not answer; the sentence, for the request it failed."""
        self.num_unreachable += 1
        what = f"rank {msg.rank} cannot reach rank {msg.peer} at {msg.endpoint}: {msg.reason}"
        log.error("%s", what)
        return what

    def ask_to_rejoin(self, rank: int) -> None:
        status = self.workers.ranks[rank]
        now = time.monotonic()
        if now - status.asked_to_rejoin_at > REJOIN_RETRY_S:
            log.warning("rank %d speaks again after being given up: asking it to rejoin", rank)
            if self.send(rank, Rejoin()):
                status.asked_to_rejoin_at = now
