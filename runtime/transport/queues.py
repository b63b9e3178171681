"""Small typed queues that hide ZeroMQ (mini-sglang's habit).

  ConductorQueue  the conductor's ROUTER socket: workers (local or on other hosts) connect
                  to it; `send(rank, msg)` / `await recv()`; asyncio.
  WorkerQueue     a worker's DEALER socket to the conductor; blocking.
  EdgeInbox       a worker's PULL socket where other ranks push EdgeTensors.
  EdgeOutbox      PUSH sockets to other ranks' inboxes, connected lazily.

With `keys` (runtime/transport/keys.py) every socket speaks CURVE: the ROUTER serves with the
server pair and each inbox with its own rank's pair, so a pusher dials a peer with that peer's
public key; ranks are clients with their own key; the conductor drops a message whose socket
identity names another rank than the key its sender authenticated with.

A multipart ZeroMQ message is [msgpack envelope, tensor frames...]; `tensors` passed to a
send are attached as frames and their headers written into the message's `tensors` field.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import torch
import zmq
import zmq.asyncio

from runtime.transport.frames import frame_to_tensor, tensor_to_frame
from runtime.transport.keys import ClusterKeys, make_client, make_server
from runtime.transport.messages import Message, decode, encode

Tensors = dict[str, torch.Tensor]
MAX_MESSAGE_BYTES = 4 << 30    # ZMQ_MAXMSGSIZE of every receiving socket: no frame beyond this is buffered
PUSH_TIMEOUT_S = 5.0           # how long a push to another rank may wait for its connection before failing
# ZMTP heartbeats on every TCP connection: one whose other end went silent (a pulled cable, a host that
# lost power: no FIN ever comes) is closed, so a new connection can take its place; and a connect
# attempt gives up after CONNECT_TIMEOUT_MS and is retried, so a link that comes back is used within
# seconds, not after TCP's SYN back-off (which grows to minutes).
# Known gap: a cut shorter than about two timeouts can close one end only; the conductor's ROUTER (no
# handover, so a key cannot take over another rank's identity) may then keep a rank's stale connection
# and ignore its new one, and that rank is not re-admitted until the stale one times out or it restarts.
ZMTP_HEARTBEAT_MS, ZMTP_TIMEOUT_MS, CONNECT_TIMEOUT_MS = 1000, 5000, 2000


class PeerUnreachableError(ConnectionError):
    """A push to another rank found no connection within PUSH_TIMEOUT_S."""


def _heartbeats(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.HEARTBEAT_IVL, ZMTP_HEARTBEAT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMTP_TIMEOUT_MS)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)


@dataclass
class Envelope:
    """A received message and the tensors that came with it."""

    msg: Message
    tensors: Tensors = field(default_factory=dict)


def _pack(msg: Message, tensors: Tensors | None) -> list:
    frames: list = []
    if tensors:
        metas = []
        for name, t in tensors.items():
            meta, buf = tensor_to_frame(name, t)
            metas.append(meta)
            frames.append(buf)
        msg.tensors = metas
    return [encode(msg), *frames]


class MalformedMessage(ValueError):
    """Frames that are not a message of the protocol; the receiver counts, logs and drops them."""


def _unpack(parts: list) -> Envelope:
    """The message in `parts`; MalformedMessage if it does not decode or its frames do not fit it."""
    try:
        msg = decode(parts[0].buffer if isinstance(parts[0], zmq.Frame) else parts[0])
        metas = getattr(msg, "tensors", None) or []
        if len(metas) != len(parts) - 1:
            raise ValueError(f"{type(msg).__name__}: {len(metas)} tensor headers but {len(parts) - 1} frames")
        tensors = {m.name: frame_to_tensor(m, p.buffer) for m, p in zip(metas, parts[1:])}
    except (msgspec.DecodeError, ValueError, TypeError, OverflowError) as exc:
        raise MalformedMessage(f"{exc}") from None
    return Envelope(msg, tensors)


def rank_identity(rank: int) -> bytes:
    """ZeroMQ identity of a rank's DEALER socket."""
    return f"rank-{rank}".encode()


def _rank_of(identity: bytes) -> int:
    """The rank a DEALER identity names ("rank-3", or a heartbeat's "rank-3-hb")."""
    try:
        return int(identity.decode().split("-")[1])
    except (UnicodeDecodeError, IndexError, ValueError):
        raise MalformedMessage(f"a peer with identity {identity[:32]!r} is no rank") from None


class ConductorQueue:
    """The conductor's end: one ROUTER socket that every worker connects to."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, keys: ClusterKeys | None = None) -> None:
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.keys = keys
        if keys is not None:
            make_server(self._sock, keys)   # no handover: a connected rank's identity cannot be taken over
        else:
            self._sock.setsockopt(zmq.ROUTER_HANDOVER, 1)   # a restarted rank takes over its identity
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to an absent rank raises
        self._sock.setsockopt(zmq.LINGER, 0)
        _heartbeats(self._sock)
        if endpoint.endswith(":0"):
            port = self._sock.bind_to_random_port(endpoint.rsplit(":", 1)[0])
            endpoint = f"{endpoint.rsplit(':', 1)[0]}:{port}"
        else:
            self._sock.bind(endpoint)
        self.endpoint = endpoint

    def send(self, rank: int, msg: Message, tensors: Tensors | None = None) -> None:
        """Queue `msg` for `rank`; raises zmq.ZMQError if that rank is not connected."""
        sent = self._sock.send_multipart([rank_identity(rank), *_pack(msg, tensors)], copy=False)
        if sent.done() and sent.exception() is not None:
            raise sent.exception()

    async def recv(self) -> tuple[int, Envelope]:
        """The next message from any worker, with the sender's rank."""
        parts = await self._sock.recv_multipart(copy=False)
        rank = _rank_of(bytes(parts[0].buffer))
        if self.keys is not None and parts[-1].get("User-Id") != f"rank-{rank}":
            raise MalformedMessage(f"a peer calling itself rank {rank} holds the key of {parts[-1].get('User-Id')}")
        return rank, _unpack(parts[1:])

    def close(self) -> None:
        self._sock.close(0)


class WorkerQueue:
    """A worker's end of the control channel."""

    def __init__(self, ctx: zmq.Context, endpoint: str, rank: int, keys: ClusterKeys | None = None,
                 identity: bytes | None = None) -> None:
        self._sock = ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._sock.setsockopt(zmq.IDENTITY, identity or rank_identity(rank))
        if keys is not None:
            make_client(self._sock, keys, keys.server_public)
        self._sock.setsockopt(zmq.LINGER, 1000)
        _heartbeats(self._sock)
        self._sock.connect(endpoint)
        self.socket = self._sock   # exposed for zmq.Poller

    def send(self, msg: Message, tensors: Tensors | None = None) -> None:
        self._sock.send_multipart(_pack(msg, tensors), copy=False)

    def recv(self) -> Envelope:
        return _unpack(self._sock.recv_multipart(copy=False))

    def close(self) -> None:
        self._sock.close()


class EdgeInbox:
    """Where other ranks push a worker's cross-rank inputs: bound on `bind` ("*": every interface),
    announced to peers as `tcp://<advertise>:<port>` (runtime/transport/addresses.py)."""

    def __init__(self, ctx: zmq.Context, bind: str, advertise: str, keys: ClusterKeys | None = None) -> None:
        self._sock = ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        if keys is not None:
            make_server(self._sock, keys)
        _heartbeats(self._sock)
        port = self._sock.bind_to_random_port(f"tcp://{bind}")
        self.endpoint = f"tcp://{advertise}:{port}"
        self.socket = self._sock

    def recv(self) -> Envelope:
        return _unpack(self._sock.recv_multipart(copy=False))

    def close(self) -> None:
        self._sock.close(0)


class EdgeOutbox:
    """PUSH sockets to other ranks' inboxes, one per rank, connected on first use. With keys, each
    inbox is dialled with its rank's public key (`keys.rank_publics`, then what Peers says)."""

    def __init__(self, ctx: zmq.Context, keys: ClusterKeys | None = None) -> None:
        self._ctx = ctx
        self._keys = keys
        self._endpoints: dict[int, str] = {}
        self._publics: dict[int, bytes] = dict(keys.rank_publics) if keys is not None else {}
        self._socks: dict[int, zmq.Socket] = {}

    def endpoint(self, rank: int) -> str | None:
        return self._endpoints.get(rank)

    def set_peers(self, endpoints: dict[int, str], publics: dict[int, bytes] | None = None) -> None:
        """Where each rank listens, and its public key: a rank whose address or key changed (it restarted)
        is dialled anew."""
        publics = publics or {}
        for rank, ep in endpoints.items():
            key = publics.get(rank, self._publics.get(rank))
            if (self._endpoints.get(rank) != ep or self._publics.get(rank) != key) and rank in self._socks:
                self._socks.pop(rank).close(0)
            self._endpoints[rank] = ep
            if key is not None:
                self._publics[rank] = key

    def send(self, rank: int, msg: Message, tensors: Tensors | None = None) -> None:
        """Push to `rank`; PeerUnreachableError when no connection to it is up within PUSH_TIMEOUT_S
        (IMMEDIATE: nothing is queued for a peer that never answered, so a wrong address fails
        this batch now instead of the consumer's after its 30 s input wait)."""
        if rank not in self._socks:
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.SNDTIMEO, int(PUSH_TIMEOUT_S * 1000))
            _heartbeats(sock)
            if self._keys is not None:
                make_client(sock, self._keys, self._publics[rank])
            sock.connect(self._endpoints[rank])
            self._socks[rank] = sock
        try:
            self._socks[rank].send_multipart(_pack(msg, tensors), copy=False)
        except zmq.Again:
            raise PeerUnreachableError(f"rank {rank} at {self._endpoints[rank]} took no connection within "
                                       f"{PUSH_TIMEOUT_S:g} s (is that address reachable from this host? "
                                       f"`mstar-run worker --advertise` sets what a rank announces)") from None

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close(0)
