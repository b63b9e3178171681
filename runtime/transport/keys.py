"""CURVE keys of one serving cluster, and the ZAP guard that admits only their holders.

Every ZeroMQ socket of mstar is encrypted and authenticated with CURVE: the conductor's
ROUTER and each worker's tensor inbox are CURVE servers (one server key pair per cluster);
each rank is a CURVE client with its own key pair. The ZAP guard on every process admits a
client only if its public key is one of the cluster's ranks and names that rank as the
peer's User-Id, so the conductor can drop a message whose socket identity claims another
rank. A refused handshake is counted and logged with the peer's address.

Key files are JSON (z85 text), written 0600:
  server file  (`mstar-run keygen`: server.json; or made per start in a private directory)
      {"server_public", "server_secret", "ranks": {"<rank>": "<public>"}}
  rank file    (rank-<k>.json, handed to the operator of rank k's host)
      the same plus {"rank": k, "public", "secret"} of that rank
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.auth.base import Authenticator
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterKeys:
    """The keys a process holds: the server pair, every rank's public key, and its own pair."""

    server_public: bytes
    server_secret: bytes
    rank_publics: dict[int, bytes]
    rank: int | None = None          # whose client pair this holds (None: the conductor)
    public: bytes = b""
    secret: bytes = b""

    @staticmethod
    def generate(num_ranks: int) -> tuple[ClusterKeys, dict[int, ClusterKeys]]:
        """Fresh keys: the conductor's view and each rank's."""
        server_public, server_secret = zmq.curve_keypair()
        pairs = {r: zmq.curve_keypair() for r in range(num_ranks)}
        publics = {r: pub for r, (pub, _) in pairs.items()}
        conductor = ClusterKeys(server_public, server_secret, publics)
        ranks = {r: ClusterKeys(server_public, server_secret, publics, r, pub, sec) for r, (pub, sec) in pairs.items()}
        return conductor, ranks

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
        out: dict[str, Any] = {"server_public": self.server_public.decode(), "server_secret": self.server_secret.decode(),
                               "ranks": {str(r): k.decode() for r, k in self.rank_publics.items()}}
        if self.rank is not None:
            out.update(rank=self.rank, public=self.public.decode(), secret=self.secret.decode())
        return out

    def write(self, path: str | Path) -> None:
        """Write the key file readable by its owner only (created 0600, never world-readable)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_json(), f)

    @staticmethod
    def load(path: str | Path) -> ClusterKeys:
        try:
            data = json.loads(Path(path).read_text())
            return ClusterKeys(data["server_public"].encode(), data["server_secret"].encode(),
                               {int(r): k.encode() for r, k in data["ranks"].items()}, data.get("rank"),
                               data.get("public", "").encode(), data.get("secret", "").encode())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not an mstar key file ({exc}); write one with `mstar-run keygen`") from None


def write_cluster_keys(directory: str | Path, num_ranks: int) -> list[Path]:
    """`mstar-run keygen`: server.json and rank-<k>.json in `directory` (created 0700)."""
    out = Path(directory)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    conductor, ranks = ClusterKeys.generate(num_ranks)
    paths = [out / "server.json", *(out / f"rank-{r}.json" for r in ranks)]
    conductor.write(paths[0])
    for r, keys in ranks.items():
        keys.write(out / f"rank-{r}.json")
    return paths


def cluster_keys(keys_dir: str | None, num_ranks: int) -> tuple[ClusterKeys, dict[int, str]]:
    """The conductor's keys and each local rank's key file: from `mstar-run keygen`'s directory,
    or made for this start in a fresh directory only this user can read (mkdtemp: 0700)."""
    if keys_dir is not None:
        conductor = ClusterKeys.load(Path(keys_dir) / "server.json")
        files = {r: str(Path(keys_dir) / f"rank-{r}.json") for r in range(num_ranks)}
        return conductor, {r: f for r, f in files.items() if os.path.exists(f)}
    conductor, ranks = ClusterKeys.generate(num_ranks)
    directory = tempfile.mkdtemp(prefix="mstar-keys-")
    files = {}
    for r, keys in ranks.items():
        files[r] = os.path.join(directory, f"rank-{r}.json")
        keys.write(files[r])
    return conductor, files


# ---- sockets ---------------------------------------------------------------------------

def make_server(sock: zmq.Socket, keys: ClusterKeys) -> None:
    """`sock` (before bind) accepts only CURVE clients the guard admits."""
    sock.curve_secretkey = keys.server_secret
    sock.curve_publickey = keys.server_public
    sock.curve_server = True


def make_client(sock: zmq.Socket, keys: ClusterKeys) -> None:
    """`sock` (before connect) talks CURVE to a cluster server with this rank's pair."""
    sock.curve_serverkey = keys.server_public
    sock.curve_publickey, sock.curve_secretkey = keys.client_keys()


@dataclass
class _Admission:
    """Shared by both guards: which keys are which rank; what was refused."""

    rank_of: dict[bytes, int]
    refused: int = 0
    address: str = field(default="")


class _RankGuard:
    """Mixin over pyzmq's Authenticator: rank keys only, User-Id "rank-<k>", refusals logged."""

    admission: _Admission

    def curve_user_id(self, client_public_key: bytes) -> str:
        return f"rank-{self.admission.rank_of[z85.encode(client_public_key)]}"

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self.admission.address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)   # type: ignore[misc]

    def _send_zap_reply(self, request_id: bytes, status_code: bytes, status_text: bytes,
                        user_id: str = "anonymous") -> None:
        if status_code != b"200":
            self.admission.refused += 1
            log.warning("refused a ZeroMQ peer at %s: %s (%d refused)", self.admission.address,
                        status_text.decode("utf-8", "replace"), self.admission.refused)
        super()._send_zap_reply(request_id, status_code, status_text, user_id)   # type: ignore[misc]


class _Keys:
    def __init__(self, admission: _Admission) -> None:
        self.admission = admission

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.admission.rank_of


class AsyncGuard(_RankGuard, AsyncioAuthenticator):
    """The conductor's guard (its sockets live on an asyncio context)."""


class ThreadGuard(_RankGuard, ThreadAuthenticator):
    """A worker's guard (plain context; ZAP answered on a thread)."""


def start_guard(ctx: zmq.Context, keys: ClusterKeys) -> Authenticator:
    """Start ZAP on `ctx`: only the cluster's rank keys get in. `guard.admission.refused` counts refusals."""
    guard_class = AsyncGuard if isinstance(ctx, zmq.asyncio.Context) else ThreadGuard
    guard = guard_class(ctx)
    guard.admission = _Admission({k: r for r, k in keys.rank_publics.items()})
    guard.start()
    guard.configure_curve_callback("*", credentials_provider=_Keys(guard.admission))
    return guard
