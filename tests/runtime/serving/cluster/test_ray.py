"""`mstar-run plan.bin --ray`: the plan's ranks as Ray actors on a two-node Ray cluster.

Host 0 of a two-namespace network (tests/netns.py) runs the Ray head and the server, host 1 a
Ray worker node; they meet only over the veth. The server reaches the cluster with `--ray
HEAD:6379`, places one actor per rank and each actor runs the normal worker, which connects
back over CURVE ZeroMQ and advertises its node's IP. The tests read where each rank landed from
`/v1/models` (and check the actor's pid is inside that node's namespace), compare the outputs
with the single-rank plan served the ordinary way, and kill actors: the request in flight fails
with a 5xx, a replacement joins, the next request succeeds (the seconds are printed).
The cluster checks Ray tokens (RAY_AUTH_MODE=token, a token from `ray get-auth-token --generate`
in a temporary HOME, never the real ~/.ray), and no secret goes through Ray: the actors' calls
are recorded and searched for every secret key. A head on host 2 that checks no token is
refused, unless --ray-allow-unauthenticated says otherwise (then /health shows it).
The test process talks HTTP to host 0 from a thread that joined host 0's network namespace.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import msgspec
import numpy as np
import openai
import pytest
import zmq
from zmq.utils import z85

from runtime.transport.keys import ClusterKeys
from tests.netns import Network, require_netns
from tests.runtime.serving.bagel.conftest import client_of, generate, pixels
from tests.runtime.serving.conftest import REPO, Server, compile_plan, http
from tests.runtime.serving.speech.conftest import ORPHEUS

pytest.importorskip("ray", reason="Ray is not installed: pip install 'mstar[cluster]' (make venv-test installs it)")

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
CLONE_NEWNET = 0x40000000
_PORTS = itertools.count(8101)


def _join_namespace(name: str) -> None:
    """Move the calling thread (only it: setns is per thread) into network namespace `name`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name} failed")
    finally:
        os.close(fd)


def _token(home: str) -> str:
    """A fresh cluster token, made as an operator does (`ray get-auth-token --generate`), in `home`."""
    env = {**ENV, "HOME": home, "RAY_AUTH_MODE": "token"}
    done = subprocess.run([RAY, "get-auth-token", "--generate"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return os.path.join(home, ".ray", "auth_token")


def _ray_start(net: Network, host: int, argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(net.command(host, [RAY, "start", *argv, f"--node-ip-address={net.address(host)}",
                                             "--num-cpus=2", "--disable-usage-stats", "--object-store-memory=100000000"]),
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"`ray start` on host {host} failed:\n{done.stderr[-3000:]}"


class Cluster:
    """A Ray head on host 0 and a worker node on host 1, each with 2 logical CPUs, checking Ray tokens
    (`env`: what every Ray process and mstar-run runs with); host 2 is outside the cluster."""

    def __init__(self, net: Network, temp_dir: str) -> None:
        self.net = net
        self.temp_dir = temp_dir
        self.address = f"{net.address(0)}:6379"
        self.env = {**ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": _token(os.path.join(temp_dir, "home"))}
        _ray_start(net, 0, ["--head", "--port=6379", "--include-dashboard=false", f"--temp-dir={temp_dir}"], self.env)
        _ray_start(net, 1, [f"--address={self.address}"], self.env)
        self.client = ThreadPoolExecutor(4, initializer=_join_namespace, initargs=(net.hosts[0],))

    def host_of(self, pid: int) -> int:
        """Which host's namespace the process runs in."""
        return next(i for i in range(len(self.net.hosts)) if pid in self.net.pids(i))


class RayServer:
    """`mstar-run PLAN --ray HEAD` on host 0; `call` runs a function in host 0's network."""

    def __init__(self, cluster: Cluster, plan: str, *extra: str, address: str = "",
                 command: tuple[str, ...] = ("-m", "runtime.entrypoints.cli"), **popen: Any) -> None:
        self.cluster = cluster
        self.url = f"http://127.0.0.1:{next(_PORTS)}"
        self.proc = cluster.net.popen(0, [sys.executable, *command, plan, "--ray", address or cluster.address,
                                          "--port", self.url.rsplit(":", 1)[1], "--log-level", "warning", *extra],
                                      cwd=REPO, env=cluster.env, **popen)

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.cluster.client.submit(fn, *args, **kwargs).result()

    def http(self, method: str, path: str, body: object | None = None, timeout: float = 120) -> tuple[int, Any]:
        return self.call(http, method, self.url + path, body, timeout)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"mstar-run --ray exited with {self.proc.returncode}"
            try:
                if self.http("GET", "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError("mstar-run --ray did not become healthy")

    def card(self) -> dict:
        return self.http("GET", "/v1/models")[1]["data"][0]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Iterator[dict[str, Server]]:
    """The single-rank plans served the ordinary way (root namespace), booting while the cluster starts."""
    tmp = tmp_path_factory.mktemp("single")
    servers = {"bagel": Server(compile_plan(tmp, "bagel", "tiny", "single"), "--batch-invariant", env=ENV),
               "orpheus": Server(compile_plan(tmp, "orpheus", "tiny", "single"), env=ENV)}
    try:
        yield servers
    finally:
        assert all(s.stop() == 0 for s in servers.values())


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Always torn down, failure included: every process of both hosts is killed by pid (the
    Network does it; `ray stop --force` would end every Ray process of the machine, by name)."""
    require_netns()
    temp_dir = tempfile.mkdtemp(prefix="mray")   # short: Ray's socket paths must fit in 107 bytes
    try:
        with Network(3, "10.203.0") as net:       # a `ray start` that fails still has its processes ended here
            made = Cluster(net, temp_dir)
            try:
                yield made
            finally:
                made.client.shutdown()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _serve(cluster: Cluster, tmp_path, graph: str, placement: str, *extra: str) -> RayServer:
    server = RayServer(cluster, compile_plan(tmp_path, graph, "tiny", placement), *extra)
    server.wait_ready()
    return server


def _kill(server: RayServer, rank: int, request: Callable[[], Any]) -> tuple[Any, float]:
    """SIGKILL rank's actor while `request` runs; (what the request raised or returned, seconds from the kill)."""
    pid = server.card()["cluster"]["ranks"][str(rank)]["pid"]
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = server.call(request)
        except Exception as exc:   # the openai client raises the 5xx
            outcome["result"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while server.http("GET", "/v1/state")[1]["num_requests"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    thread.join(60)   # liveness: without death detection it would wait for the dead rank's edges
    assert not thread.is_alive()
    return outcome["result"], time.monotonic() - killed


def test_bagel_cfg_parallel_spread_over_two_nodes(cluster, references, tmp_path) -> None:
    server = _serve(cluster, tmp_path, "bagel", "cfg_parallel", "--ray-strategy", "SPREAD", "--batch-invariant")
    try:
        card = server.card()
        ranks = card["cluster"]["ranks"]
        assert card["placement"] == "cfg_parallel" and sorted(ranks) == ["0", "1", "2"]
        assert [sorted(card["ranks"][r]) for r in ("1", "2")] == [["llm_cfg_text"], ["llm_cfg_img"]]
        hosts = {r: cluster.host_of(info["pid"]) for r, info in ranks.items()}
        assert all(ranks[r]["node_ip"] == cluster.net.address(h) for r, h in hosts.items()), (ranks, hosts)
        assert all(info["inbox"].startswith(f"tcp://{info['node_ip']}:") for info in ranks.values()), "Ray's node IP"
        assert set(hosts.values()) == {0, 1}, "SPREAD puts the three ranks on both nodes"
        assert {info["bundle"]["CPU"] for info in ranks.values()} == {1.0}

        references["bagel"].wait_ready()
        want = pixels(generate(client_of(references["bagel"]), seed=5).data[0].b64_json)
        before = cluster.net.counters(1)
        got = pixels(server.call(lambda: generate(server.client(), seed=5).data[0].b64_json))
        after = cluster.net.counters(1)
        print(f"\nBAGEL 64x48, 4 steps: host 1's veth carried {after[0] - before[0]} B in, {after[1] - before[1]} B out")
        assert got.std() > 5 and np.array_equal(got, want), "cfg_parallel over Ray draws what single draws"

        remote = next(r for r, h in hosts.items() if h == 1)
        failed, seconds = _kill(server, int(remote), lambda: generate(server.client(), seed=5, steps=200))
        assert isinstance(failed, openai.InternalServerError) and "died" in str(failed), failed
        print(f"rank {remote}'s actor killed: its request failed after {seconds:.2f} s")
        start = time.monotonic()
        again = pixels(server.call(lambda: generate(server.client(), seed=5).data[0].b64_json))
        print(f"the next request succeeded {time.monotonic() - start:.2f} s later (a replacement actor joined)")
        assert np.array_equal(again, want)
        replaced = server.card()["cluster"]["ranks"][remote]
        assert replaced["pid"] != ranks[remote]["pid"] and cluster.host_of(replaced["pid"]) == 1, "same bundle, same node"
    finally:
        assert server.stop() == 0


def _speak(client: openai.OpenAI, max_tokens: int = 70) -> bytes:
    with client.audio.speech.with_streaming_response.create(
            model=ORPHEUS, voice="tara", input="Hello there.", response_format="pcm",
            extra_body={"max_tokens": max_tokens, "temperature": 0.0}) as resp:
        return b"".join(resp.iter_bytes())


def test_orpheus_tp2_packs_its_group_on_one_node(cluster, references, tmp_path) -> None:
    server = _serve(cluster, tmp_path, "orpheus", "tp2")
    try:
        card = server.card()
        ranks = card["cluster"]["ranks"]
        assert card["placement"] == "tp2" and sorted(ranks) == ["0", "1"]
        assert {info["strategy"] for info in ranks.values()} == {"STRICT_PACK"}
        assert len({info["placement_group"] for info in ranks.values()}) == 1
        assert len({cluster.host_of(info["pid"]) for info in ranks.values()}) == 1, "a TP group shares a node"
        shards = [card["ranks"][r]["lm"]["params"] for r in ("0", "1")]

        references["orpheus"].wait_ready()
        want = _speak(client_of(references["orpheus"]))
        assert len(want) >= 2 * 2048 and server.call(lambda: _speak(server.client())) == want

        failed, seconds = _kill(server, 1, lambda: _speak(server.client(), max_tokens=1000))
        assert isinstance(failed, Exception), "a 5xx, or a stream cut without its end: never a clean answer"
        print(f"\nTP rank 1's actor killed: its request ended after {seconds:.2f} s")
        start = time.monotonic()
        assert server.call(lambda: _speak(server.client())) == want
        print(f"the next request succeeded {time.monotonic() - start:.2f} s later (the TP group started anew)")
        after = server.card()
        assert all(after["cluster"]["ranks"][r]["pid"] != ranks[r]["pid"] for r in ("0", "1")), "both TP ranks anew"
        assert [after["ranks"][r]["lm"]["params"] for r in ("0", "1")] == shards
    finally:
        assert server.stop() == 0


def _recorded(record: str) -> dict[int, dict[str, dict]]:
    """What each actor (by pid) was handed through Ray, per call (recording_run.py's files)."""
    calls: dict[int, dict[str, dict]] = {}
    for name in os.listdir(record):
        pid, call = name.removesuffix(".msgpack").split("-")
        with open(os.path.join(record, name), "rb") as f:
            calls.setdefault(int(pid), {})[call] = msgspec.msgpack.decode(f.read())
    return calls


def _secrets_in(record: str, secrets: list[bytes]) -> list[str]:
    """Files of `record` holding any of `secrets`, as z85 text or as their 32 raw bytes."""
    found = []
    for name in os.listdir(record):
        with open(os.path.join(record, name), "rb") as f:
            data = f.read()
        found += [name for s in secrets if s in data or z85.decode(s) in data]
    return found


def _handshakes(endpoint: str, keys: ClusterKeys, server_public: bytes, wait_s: float = 3.0) -> bool:
    """Whether a CURVE client holding `keys`' pair completes a handshake with the conductor at `endpoint`
    (IMMEDIATE: the socket is writable only once one has)."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.IDENTITY, b"key-probe")     # sends nothing: the conductor never reads it
        sock.curve_serverkey = server_public
        sock.curve_publickey, sock.curve_secretkey = keys.client_keys()
        sock.connect(endpoint)
        return bool(sock.poll(int(wait_s * 1000), zmq.POLLOUT))
    finally:
        ctx.destroy(0)


def _replaced(server: RayServer, rank: str, old_pid: int, timeout: float = 120) -> dict:
    """The rank's info once a replacement actor serves it (its new key admitted, every rank ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = server.card()["cluster"]["ranks"][rank]
        if info.get("pid", old_pid) != old_pid and "public_key" in info and server.http("GET", "/health")[0] == 200:
            return info
        time.sleep(0.3)
    raise TimeoutError(f"no replacement actor for rank {rank} became ready")


def test_actors_are_handed_no_secret_and_only_the_keys_they_made_get_in(cluster, tmp_path) -> None:
    """The server starts with `mstar-run keygen` keys (so the test knows the server secret and keys
    the actors must not be admitted with) and actors that record their calls."""
    keys_dir, record = tmp_path / "keys", str(tmp_path / "record")
    os.mkdir(record)
    subprocess.run([sys.executable, "-m", "runtime.entrypoints.cli", "keygen", "--ranks", "2", "--out", str(keys_dir)], cwd=REPO,
                   check=True, capture_output=True)
    server_keys = ClusterKeys.load(keys_dir / "server.json")
    keygen_ranks = [ClusterKeys.load(keys_dir / f"rank-{r}.json") for r in (0, 1)]
    endpoint = f"tcp://{cluster.net.address(0)}:8190"
    recording = os.path.join(os.path.dirname(__file__), "recording_run.py")
    server = RayServer(cluster, compile_plan(tmp_path, "smollm2", "tiny", "replicas"), "--keys", str(keys_dir),
                       "--worker-endpoint", endpoint, command=(recording, record))
    try:
        server.wait_ready()
        assert server.http("GET", "/health")[1]["ray_token_auth"] is True
        ranks, calls = server.card()["cluster"]["ranks"], _recorded(record)
        actor_keys = {pid: ClusterKeys.load(c["keygen"]["key_path"]) for pid, c in calls.items()}
        for r, info in ranks.items():
            handed = calls[info["pid"]]
            assert handed["keygen"]["args"] == [int(r), server_keys.server_public.decode()]
            launch, plan = handed["run"]["args"]
            assert launch["key_file"] is None and launch["server_key"] == server_keys.server_public.decode()
            assert info["public_key"] == handed["keygen"]["result"].decode() == actor_keys[info["pid"]].public.decode()
        secrets = [server_keys.secret, *(k.secret for k in keygen_ranks), *(k.secret for k in actor_keys.values())]
        assert _secrets_in(record, secrets) == [], "a secret key went through Ray"

        probe = lambda keys: server.call(_handshakes, endpoint, keys, server_keys.server_public)   # noqa: E731
        assert all(probe(keys) for keys in actor_keys.values()), "each actor's own key gets in"
        assert not any(probe(keys) for keys in keygen_ranks), "keygen's rank keys are not what the actors hold"
        status, body = server.http("POST", "/v1/chat/completions", {
            "model": server.card()["id"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert status == 200, body

        old_pid = ranks["1"]["pid"]
        old = actor_keys[old_pid]
        os.kill(old_pid, signal.SIGKILL)
        new_info = _replaced(server, "1", old_pid)
        new = ClusterKeys.load(_recorded(record)[new_info["pid"]]["keygen"]["key_path"])
        assert new.public != old.public and new_info["public_key"] == new.public.decode()
        assert probe(new) and not probe(old), "the replacement's key gets in, the dead actor's no longer"
        assert _secrets_in(record, [*secrets, new.secret]) == []
    finally:
        assert server.stop() == 0


def test_a_cluster_without_token_auth_is_refused_unless_allowed(cluster, tmp_path) -> None:
    """A head on host 2 with RAY_AUTH_MODE=disabled; mstar-run holds the token (a client with a token
    connects to a cluster that checks none just as well: the check must ask the cluster)."""
    open_env = {**{k: v for k, v in ENV.items() if not k.startswith("RAY_AUTH")}, "RAY_AUTH_MODE": "disabled"}
    temp_dir = tempfile.mkdtemp(prefix="mrayo")
    address = f"{cluster.net.address(2)}:6379"
    plan = compile_plan(tmp_path, "smollm2", "tiny", "single")
    try:
        _ray_start(cluster.net, 2, ["--head", "--port=6379", "--include-dashboard=false", f"--temp-dir={temp_dir}"],
                   open_env)
        with open(tmp_path / "refused.log", "w+") as log:
            refused = RayServer(cluster, plan, address=address, stderr=log)
            assert refused.proc.wait(120) == 2
            log.seek(0)
            said = log.read()
        assert "without token authentication" in said and "RAY_AUTH_MODE=token" in said, said[-2000:]
        assert "ray get-auth-token" in said and "--ray-allow-unauthenticated" in said

        with open(tmp_path / "allowed.log", "w+") as log:
            # host 0 is no node of that cluster: its actor dials the conductor at host 0's own address
            allowed = RayServer(cluster, plan, "--ray-allow-unauthenticated", "--worker-endpoint",
                                f"tcp://{cluster.net.address(0)}:0", address=address, stderr=log)
            try:
                allowed.wait_ready()
                assert allowed.http("GET", "/health")[1]["ray_token_auth"] is False
                assert allowed.card()["cluster"]["token_auth"] is False
            finally:
                assert allowed.stop() == 0
            log.seek(0)
            warnings = [line for line in log.read().splitlines() if "WITHOUT token authentication" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    finally:
        cluster.net.kill_host(2)       # the open head and its actors, by pid
        shutil.rmtree(temp_dir, ignore_errors=True)
