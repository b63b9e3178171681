"""The control and data planes are CURVE-authenticated (real sockets, real server): a peer with
no key or an unknown key is refused at the handshake (counted, logged), one that claims rank 0's
identity without its key receives nothing, and serving goes on untouched."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import psutil
import pytest
import zmq

from runtime.transport.keys import ClusterKeys
from runtime.transport.messages import BatchDone, Hello, ItemResult, encode
from tests.runtime.serving.conftest import REPO, Server, compile_plan, free_port, http, plan_dir  # noqa: F401  (plan_dir: the session fixture)

MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("curve") / "keys"
    subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "keygen", "--ranks", "1", "--out", str(out)], cwd=REPO,
                   check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def server(plan_dir, keys_dir):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    srv = Server(compile_plan(plan_dir, "smollm2", preset="tiny"), "--worker-endpoint", endpoint, "--keys", keys_dir,
                 env={"OMP_NUM_THREADS": "1"})
    srv.endpoint = endpoint
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


def wait_metric(server: Server, name: str, at_least: float, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while server.metric(name) < at_least and time.monotonic() < deadline:
        time.sleep(0.2)
    return server.metric(name)


def test_key_files_are_private(keys_dir) -> None:
    for name in ("server.json", "rank-0.json"):
        assert stat.S_IMODE(os.stat(os.path.join(keys_dir, name)).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(keys_dir).st_mode) == 0o700


def unknown_peer(ctx: zmq.Context, kind: int, server_public: bytes | None) -> zmq.Socket:
    """A socket with no key (server_public None: plain ZeroMQ, which libzmq refuses before ZAP as a
    mechanism mismatch) or with a fresh key of no rank and the server's public key (ZAP refuses it)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if server_public is not None:
        sock.curve_serverkey = server_public
        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    return sock


def test_a_peer_without_the_key_claiming_rank_0_is_refused_and_gets_nothing(server, keys_dir) -> None:
    _, before = http("POST", f"{server.url}/v1/chat/completions", CHAT)
    refused = server.metric("mstar_refused_peers")
    ctx = zmq.Context()
    try:
        thieves = []
        for where in (None, ClusterKeys.load(f"{keys_dir}/server.json").server_public):
            sock = unknown_peer(ctx, zmq.DEALER, where)
            sock.setsockopt(zmq.IDENTITY, b"rank-0")
            sock.connect(server.endpoint)
            for msg in (Hello(rank=0, pid=1, peer_endpoint="tcp://127.0.0.1:9"),
                        BatchDone(batch_id=1, rank=0, items=[ItemResult(request_id=1, tokens=[1])])):
                sock.send(encode(msg), zmq.NOBLOCK) if sock.poll(0, zmq.POLLOUT) else None
            thieves.append(sock)
        assert wait_metric(server, "mstar_refused_peers", refused + 1) >= refused + 1
        status, after = http("POST", f"{server.url}/v1/chat/completions", CHAT)
        assert status == 200 and after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
        assert all(not sock.poll(500) for sock in thieves)      # not one frame of the request reached them
    finally:
        ctx.destroy(0)


def test_a_peer_without_the_key_cannot_push_into_a_worker_inbox(server, keys_dir) -> None:
    pid = http("GET", f"{server.url}/health")[1]["worker_pids"]["0"]
    (port,) = sorted(c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN)
    refused = server.metric("mstar_refused_peers")
    ctx = zmq.Context()
    try:
        push = unknown_peer(ctx, zmq.PUSH, ClusterKeys.load(f"{keys_dir}/rank-0.json").public)   # its inbox's key
        push.setsockopt(zmq.IMMEDIATE, 1)          # writable only once a handshake has completed
        push.connect(f"tcp://127.0.0.1:{port}")
        assert not push.poll(1000, zmq.POLLOUT)     # the handshake never completes: nothing can be sent
        assert wait_metric(server, "mstar_refused_peers", refused + 1) >= refused + 1
    finally:
        ctx.destroy(0)
    assert http("POST", f"{server.url}/v1/chat/completions", CHAT)[0] == 200
