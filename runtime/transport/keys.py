"""CURVE keys of one serving cluster, and the ZAP guard that admits only their holders.

Every ZeroMQ socket of mstar is encrypted and authenticated with CURVE. Each process serves
with a key pair only it holds: the conductor's ROUTER with the server pair, each worker's
tensor inbox with its rank's own pair (peers dial it with that rank's public key). Each rank
is a CURVE client with its own pair. So no secret is ever shared: a rank's secret is made
where the rank runs (a Ray actor makes its own) or handed to that rank's host alone, and the
server secret never leaves the conductor's host. Public keys are what travels: the conductor
admits the keys its ranks hold and tells every rank its peers' keys (the Peers message).
The ZAP guard on every process admits a client only if its public key is one of the
cluster's ranks and names that rank as the peer's User-Id, so the conductor can drop a
message whose socket identity claims another rank. An unknown key is refused with ZAP's
"temporary" status: the peer is disconnected without an ERROR and dials again, so a rank
whose key is on its way (a Ray actor's, a peer announced after it dialled) gets in once
admitted, while an unknown key never does. Refusals are counted and logged with the
peer's address.

Key files are JSON (z85 text), written 0600:
  server file  (`mstar-run keygen`: server.json; the conductor's)
      {"server_public", "server_secret", "ranks": {"<rank>": "<public>"}}
  rank file    (rank-<k>.json, handed to the operator of rank k's host; no server secret)
      {"server_public", "ranks", "rank": k, "public", "secret"} of that rank
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.auth.base import Authenticator
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from runtime.transport.log_rate import is_worth_logging

log = logging.getLogger(__name__)
# A server drops a connection whose handshake is not done by then: a peer answered "temporary" (see above)
# dials again this often; a LAN handshake takes milliseconds.
HANDSHAKE_IVL_MS = 2000


@dataclass(frozen=True)
class ClusterKeys:
    """The keys a process holds: the conductor's public key, the rank keys it knows, and its own pair
    (the conductor's: the server pair; a rank's: that rank's, which its inbox serves with too)."""

    server_public: bytes
    rank_publics: dict[int, bytes]   # rank -> its public key (z85), as far as this process knows them
    public: bytes                    # this process's own pair (z85)
    secret: bytes
    rank: int | None = None          # whose pair this is (None: the conductor's server pair)

    @staticmethod
    def generate(ranks: Iterable[int]) -> tuple[ClusterKeys, dict[int, ClusterKeys]]:
        """Fresh keys: the conductor's view and each of `ranks`'."""
        server_public, server_secret = zmq.curve_keypair()
        pairs = {r: zmq.curve_keypair() for r in ranks}
        publics = {r: pub for r, (pub, _) in pairs.items()}
        conductor = ClusterKeys(server_public, publics, server_public, server_secret)
        return conductor, {r: ClusterKeys(server_public, publics, pub, sec, r) for r, (pub, sec) in pairs.items()}

    @staticmethod
    def for_rank(rank: int, server_public: bytes) -> ClusterKeys:
        """A fresh pair for `rank`, made where the rank runs (a Ray actor); peers' keys come with Peers."""
        public, secret = zmq.curve_keypair()
        return ClusterKeys(server_public, {rank: public}, public, secret, rank)

    def check_rank(self, rank: int) -> None:
        """A worker started for `rank` must hold that rank's key."""
        if self.rank != rank:
            raise ValueError(f"this key file holds the key of rank {self.rank}, not of rank {rank}")

    def client_keys(self) -> tuple[bytes, bytes]:
        """(public, secret) this process uses as a CURVE client (a rank's own pair)."""
        if self.rank is None:
            raise ValueError("the conductor's keys hold no rank key pair")
        return self.public, self.secret

    # ---- files -----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"server_public": self.server_public.decode(),
                               "ranks": {str(r): k.decode() for r, k in self.rank_publics.items()}}
        if self.rank is None:
            out["server_secret"] = self.secret.decode()
        else:
            out.update(rank=self.rank, public=self.public.decode(), secret=self.secret.decode())
        return out

    def write(self, path: str | Path) -> None:
        """Write the key file readable by its owner only (created 0600, never world-readable)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_json(), f)

    @staticmethod
    def load(path: str | Path) -> ClusterKeys:
        """A server file or a rank file (one written before rank files lost the server secret loads too)."""
        try:
            data = json.loads(Path(path).read_text())
            rank, server_public = data.get("rank"), data["server_public"].encode()
            public, secret = ((server_public, data["server_secret"].encode()) if rank is None
                              else (data["public"].encode(), data["secret"].encode()))
            return ClusterKeys(server_public, {int(r): k.encode() for r, k in data["ranks"].items()}, public,
                               secret, rank)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not an mstar key file ({exc}); write one with `mstar-run keygen`") from None


def write_cluster_keys(directory: str | Path, num_ranks: int) -> list[Path]:
    """`mstar-run keygen`: server.json and rank-<k>.json in `directory` (created 0700)."""
    out = Path(directory)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    conductor, ranks = ClusterKeys.generate(range(num_ranks))
    paths = [out / "server.json", *(out / f"rank-{r}.json" for r in ranks)]
    conductor.write(paths[0])
    for r, keys in ranks.items():
        keys.write(out / f"rank-{r}.json")
    return paths


def cluster_keys(keys_dir: str | None, ranks: Iterable[int]) -> tuple[ClusterKeys, dict[int, str]]:
    """The conductor's keys and a key file for each of `ranks` (those it starts as subprocesses): from
    `mstar-run keygen`'s directory, or made for this start in a fresh directory only this user can read
    (mkdtemp: 0700). Ranks started elsewhere (Ray actors) make their own pair; the conductor admits it."""
    if keys_dir is not None:
        conductor = ClusterKeys.load(Path(keys_dir) / "server.json")
        files = {r: str(Path(keys_dir) / f"rank-{r}.json") for r in ranks}
        return conductor, {r: f for r, f in files.items() if os.path.exists(f)}
    conductor, made = ClusterKeys.generate(ranks)
    if not made:
        return conductor, {}
    directory = tempfile.mkdtemp(prefix="mstar-keys-")
    files = {}
    for r, keys in made.items():
        files[r] = os.path.join(directory, f"rank-{r}.json")
        keys.write(files[r])
    return conductor, files


# ---- sockets ---------------------------------------------------------------------------

def make_server(sock: zmq.Socket, keys: ClusterKeys) -> None:
    """`sock` (before bind) serves with this process's own pair and accepts only CURVE clients the guard admits."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)


def make_client(sock: zmq.Socket, keys: ClusterKeys, server_public: bytes) -> None:
    """`sock` (before connect) talks CURVE with this rank's pair to the server holding `server_public`
    (the conductor's, or a peer rank's own)."""
    sock.curve_serverkey = server_public
    sock.curve_publickey, sock.curve_secretkey = keys.client_keys()


@dataclass
class Admission:
    """Shared by both guards: which keys are which rank; what was refused. `rank_of` is replaced whole,
    never changed in place: a worker's guard reads it on its own thread."""

    rank_of: dict[bytes, int]        # z85 public key -> rank
    refused: int = 0
    address: str = field(default="")

    def admit(self, rank: int, public: bytes) -> None:
        """`rank` holds `public` from now on; a key it held before is refused (a replaced Ray actor's)."""
        self.rank_of = {**{k: r for k, r in self.rank_of.items() if r != rank}, public: rank}

    def revoke(self, rank: int) -> None:
        self.rank_of = {k: r for k, r in self.rank_of.items() if r != rank}

    def replace(self, keys: dict[int, bytes]) -> None:
        """Admit exactly `keys` (rank -> public key)."""
        self.rank_of = {k: r for r, k in keys.items()}

    def keys(self) -> dict[int, bytes]:
        """rank -> the public key admitted for it."""
        return {r: k for k, r in self.rank_of.items()}


class _RankGuard:
    """Mixin over pyzmq's Authenticator: rank keys only, User-Id "rank-<k>", refusals logged."""

    admission: Admission

    def curve_user_id(self, client_public_key: bytes) -> str:
        # "?" if the key was revoked since the callback admitted it: the conductor drops what it then sends
        return f"rank-{self.admission.rank_of.get(z85.encode(client_public_key), '?')}"

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self.admission.address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)   # type: ignore[misc]

    def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes,
                        user_id: str = "anonymous") -> None:
        if status_code != b"200":
            self.admission.refused += 1
            if is_worth_logging(self.admission.refused):    # a refused peer dials again (300): not a log line each time
                log.warning("refused a ZeroMQ peer at %s: %s (%d refused)", self.admission.address,
                            status_text.decode("utf-8", "replace"), self.admission.refused)
            status_code = b"300"    # temporary: disconnected without an ERROR, so it dials again (module docstring)
        super()._send_zap_reply(request_id, status_code, status_text, user_id)   # type: ignore[misc]


class _Keys:
    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.admission.rank_of


class AsyncGuard(_RankGuard, AsyncioAuthenticator):
    """The conductor's guard (its sockets live on an asyncio context)."""


class ThreadGuard(_RankGuard, ThreadAuthenticator):
    """A worker's guard (plain context; ZAP answered on a thread)."""


def start_guard(ctx: zmq.Context, keys: ClusterKeys) -> Authenticator:
    """Start ZAP on `ctx`: only the rank keys in `keys` get in (`guard.admission` admits more or fewer later).
    `guard.admission.refused` counts refusals."""
    guard_class = AsyncGuard if isinstance(ctx, zmq.asyncio.Context) else ThreadGuard
    guard = guard_class(ctx)
    guard.admission = Admission({k: r for r, k in keys.rank_publics.items()})
    guard.start()
    guard.configure_curve_callback("*", credentials_provider=_Keys(guard.admission))
    return guard
