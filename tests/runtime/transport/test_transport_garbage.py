"""Garbage into a live worker's inbox (real sockets, real server), sent by a peer that holds a
rank's CURVE key (a buggy or compromised rank: a peer without a key does not get in at all,
tests/runtime/serving/test_curve.py): everything is counted and dropped, the worker keeps
serving, the next answer is the same."""
from __future__ import annotations

import random
import time

import msgspec
import psutil
import pytest
import zmq

from runtime.transport.frames import TensorMeta
from runtime.transport.keys import ClusterKeys, make_client, write_cluster_keys
from runtime.transport.messages import EdgeTensors, KVState, StreamItems, encode
from tests.runtime.serving.conftest import Server, compile_plan, http, plan_dir  # noqa: F401  (plan_dir: the session fixture)

MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def keys_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("keys") / "cluster"
    write_cluster_keys(out, 1)
    return str(out)


@pytest.fixture(scope="module")
def server(plan_dir, keys_dir):
    srv = Server(compile_plan(plan_dir, "smollm2", preset="tiny"), "--keys", keys_dir, env={"OMP_NUM_THREADS": "1"})
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


def listening_ports(pid: int) -> list[int]:
    return sorted(c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN)


def forged_frames(rng: random.Random) -> list[bytes]:
    """One message of garbage: random bytes, or protocol messages that name nothing real."""
    kind = rng.randrange(6)
    if kind == 0:
        return [rng.randbytes(rng.randrange(1, 64)) for _ in range(rng.randrange(1, 4))]
    if kind == 1:
        return [b"\xc1garbage"]
    if kind == 2:   # an empty frame whose header names 10^12 floats
        return [encode(EdgeTensors(request_id=1, tensors=[TensorMeta("lm.hidden#1", "float32", (10**6, 10**6))])), b""]
    if kind == 3:
        return [encode(StreamItems(request_id=rng.randrange(100), stream="no_such_stream", index=0))]
    if kind == 4:
        return [encode(KVState(request_id=rng.randrange(100), node="no_such_node", num_tokens=3))]
    return [msgspec.msgpack.encode({"type": "run", "batch_id": "x"}), rng.randbytes(8)]


def test_ten_thousand_garbage_frames_leave_the_worker_serving(server, keys_dir) -> None:
    _, before = http("POST", f"{server.url}/v1/chat/completions", CHAT)
    pid = http("GET", f"{server.url}/health")[1]["worker_pids"]["0"]
    (inbox_port,) = listening_ports(pid)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 5000)
    rank0 = ClusterKeys.load(f"{keys_dir}/rank-0.json")
    make_client(push, rank0, rank0.public)    # rank 0's inbox serves with rank 0's own pair
    push.connect(f"tcp://127.0.0.1:{inbox_port}")
    rng = random.Random(14)
    for _ in range(10_000):
        push.send_multipart(forged_frames(rng))
    push.close()
    ctx.term()
    status, after = http("POST", f"{server.url}/v1/chat/completions", CHAT)
    assert status == 200 and after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
    assert http("GET", f"{server.url}/health")[1]["worker_pids"]["0"] == pid      # the same process
    deadline = time.monotonic() + 30
    while server.metric('mstar_dropped_messages{receiver="rank-0"}') < 10_000 and time.monotonic() < deadline:
        time.sleep(0.2)     # the count travels with the next heartbeats
    assert server.metric('mstar_dropped_messages{receiver="rank-0"}') == 10_000
