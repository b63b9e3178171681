"""The key scheme over real ZeroMQ sockets: no secret is shared between processes. Each inbox serves
with its own rank's pair (a pusher dials it with that rank's public key), a rank file holds no server
secret, a pair made where the rank runs is let in once admitted (the refused peer dials again), and a
rank's new key replaces its old one."""
from __future__ import annotations

import json
import os
import stat

import torch
import zmq

from runtime.transport.keys import ClusterKeys, cluster_keys, start_guard, write_cluster_keys
from runtime.transport.messages import EdgeTensors, Peers, decode, encode
from runtime.transport.queues import EdgeInbox, EdgeOutbox, PeerUnreachableError

WAIT_MS = 6000      # past a refused peer's next dial (keys.HANDSHAKE_IVL_MS) with room to spare


def test_rank_files_hold_their_own_secret_only(tmp_path) -> None:
    write_cluster_keys(tmp_path / "k", 2)
    server = json.loads((tmp_path / "k" / "server.json").read_text())
    for r in (0, 1):
        path = tmp_path / "k" / f"rank-{r}.json"
        rank = json.loads(path.read_text())
        assert "server_secret" not in rank and server["server_secret"] not in path.read_text()
        assert rank["server_public"] == server["server_public"] and rank["ranks"] == server["ranks"]
        assert rank["public"] == server["ranks"][str(r)] and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = ClusterKeys.load(tmp_path / "k" / "server.json")
    assert loaded.rank is None and loaded.public == loaded.server_public and loaded.secret == server["server_secret"].encode()


def test_an_older_rank_file_with_the_server_secret_still_loads(tmp_path) -> None:
    _, ranks = ClusterKeys.generate([0])
    data = {**ranks[0].to_json(), "server_secret": "x" * 40}
    (tmp_path / "old.json").write_text(json.dumps(data))
    loaded = ClusterKeys.load(tmp_path / "old.json")
    assert loaded == ranks[0] and b"x" * 40 not in (loaded.public, loaded.secret)


def test_a_launcher_start_makes_no_rank_files(tmp_path) -> None:
    conductor, files = cluster_keys(None, ())
    assert files == {} and conductor.rank_publics == {} and conductor.secret


def _inbox(keys: ClusterKeys) -> tuple[zmq.Context, object, EdgeInbox]:
    ctx = zmq.Context()
    guard = start_guard(ctx, keys)
    return ctx, guard, EdgeInbox(ctx, "127.0.0.1", "127.0.0.1", keys)


def _arrives(inbox: EdgeInbox, outbox: EdgeOutbox, rank: int, request_id: int) -> bool:
    try:
        outbox.send(rank, EdgeTensors(request_id=request_id, tensors=[]), {"lm.h#1": torch.ones(2)})
    except PeerUnreachableError:   # no handshake within PUSH_TIMEOUT_S
        return False
    return bool(inbox.socket.poll(WAIT_MS)) and inbox.recv().msg.request_id == request_id


def test_an_inbox_serves_with_its_own_rank_pair_and_admits_peer_keys() -> None:
    _, ranks = ClusterKeys.generate([0, 1])
    ctx, guard, inbox = _inbox(ranks[0])
    outbox = EdgeOutbox(zmq.Context(), ranks[1])
    try:
        outbox.set_peers({0: inbox.endpoint})
        assert _arrives(inbox, outbox, 0, 7), "rank 1 dials rank 0's inbox with rank 0's public key"
        stranger = EdgeOutbox(zmq.Context(), ClusterKeys.for_rank(1, ranks[1].server_public))
        stranger.set_peers({0: inbox.endpoint}, {0: ranks[0].public})
        refused = guard.admission.refused
        assert not _arrives(inbox, stranger, 0, 8) and guard.admission.refused > refused, "a key no one announced"
        stranger.close()
    finally:
        outbox.close()
        inbox.close()
        guard.stop()
        ctx.destroy(0)


def test_a_pair_made_where_the_rank_runs_gets_in_once_announced_and_its_old_key_no_longer() -> None:
    """As under Ray: rank 1's actor makes its pair; rank 0's inbox admits the public key Peers names;
    a replacement actor's new key takes the old one's place."""
    _, ranks = ClusterKeys.generate([0])
    ctx, guard, inbox = _inbox(ranks[0])
    old = ClusterKeys.for_rank(1, ranks[0].server_public)
    outbox = EdgeOutbox(zmq.Context(), old)
    try:
        outbox.set_peers({0: inbox.endpoint}, {0: ranks[0].public})
        peers = decode(encode(Peers(endpoints={0: inbox.endpoint}, keys={0: ranks[0].public.decode(),
                                                                          1: old.public.decode()})))
        guard.admission.replace({r: k.encode() for r, k in peers.keys.items()})
        assert _arrives(inbox, outbox, 0, 1)

        new = ClusterKeys.for_rank(1, ranks[0].server_public)
        guard.admission.admit(1, new.public)
        assert guard.admission.keys() == {0: ranks[0].public, 1: new.public}
        stale = EdgeOutbox(zmq.Context(), old)
        stale.set_peers({0: inbox.endpoint}, {0: ranks[0].public})
        assert not _arrives(inbox, stale, 0, 2), "the replaced actor's key is refused"
        stale.close()
        fresh = EdgeOutbox(zmq.Context(), new)
        fresh.set_peers({0: inbox.endpoint}, {0: ranks[0].public})
        assert _arrives(inbox, fresh, 0, 3)
        fresh.close()
    finally:
        outbox.close()
        inbox.close()
        guard.stop()
        ctx.destroy(0)


def test_a_peer_that_dialled_before_its_key_was_announced_gets_in_when_it_is() -> None:
    _, ranks = ClusterKeys.generate([0])
    ctx, guard, inbox = _inbox(ranks[0])
    early = ClusterKeys.for_rank(1, ranks[0].server_public)
    push = zmq.Context().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.curve_serverkey = ranks[0].public
    push.curve_publickey, push.curve_secretkey = early.client_keys()
    try:
        push.connect(inbox.endpoint)
        push.send(encode(EdgeTensors(request_id=5, tensors=[])))    # queued: no handshake has completed
        assert not inbox.socket.poll(1000) and guard.admission.refused >= 1, "refused while unknown"
        guard.admission.admit(1, early.public)
        assert inbox.socket.poll(WAIT_MS), "it dialled again (ZAP 300, not an ERROR) and got in"
        assert inbox.recv().msg.request_id == 5
    finally:
        push.close(0)
        inbox.close()
        guard.stop()
        ctx.destroy(0)
