"""network: what a real network between ranks costs, the same plan across hosts vs on one host.

Hosts are Linux network namespaces joined by veths to one bridge (runtime/launch/netns.py; needs root):
the server and rank 0 on host 0, every other rank a remote `mstar-run worker` on a host of its
own, joined with its CURVE key; everything that crosses a rank boundary crosses a veth.
  across hosts: that cluster; per request, the time and the bytes sent by all hosts' eth0
                (each byte on the bridge is sent once; CURVE framing, TCP/IP headers and the
                heartbeats of the same seconds included)
  one host:     the same plan served by one `mstar-run` on loopback (its ranks local processes)
Cases: BAGEL tiny `cfg_parallel` T2I (64x64, 8 steps: each step the CFG branches on ranks 1 and 2
get the latent and send velocities back) and Orpheus tiny `disaggregated` speech (its KV cache
moves rank 0 -> rank 1 after prefill, the decode and SNAC run on rank 1). Every process runs
torch on one thread on both sides, so the two differ only in the network.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.servers import mstar_run
from bench.stats import LOWER
from bench.peer_mstar import compile_plan
from runtime.launch.cluster import Cluster, keygen
from runtime.launch.netns import Network, unavailable_reason

ACROSS = "across namespaces: ranks on other hosts over veths (CURVE ZeroMQ, gloo)"
ONE_HOST = "one host: the same placement, ranks local processes on loopback"
CASES = {   # name -> (graph, placement, remote ranks -> host)
    "BAGEL tiny cfg_parallel T2I 64x64, 8 steps": ("bagel", "cfg_parallel", {1: 1, 2: 2}),
    "Orpheus tiny disaggregated speech, 70 tokens": ("orpheus", "disaggregated", {1: 1}),
}


def _request(graph: str) -> Callable[[str], object]:
    """One request of the case against a server at `url`, with the real `openai` client."""
    import openai

    def bagel(url: str) -> object:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        return client.images.generate(model="bagel-7b-mot", prompt="a red cube", size="64x64",
                                      extra_body={"seed": 1, "steps": 8})

    def orpheus(url: str) -> object:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        return client.audio.speech.create(model="orpheus-3b", voice="tara", input="Hello there.",
                                          response_format="pcm", extra_body={"temperature": 0.0, "max_tokens": 70})

    return bagel if graph == "bagel" else orpheus


def _case_rows(ctx: Context, case: str, graph: str, placement: str, hosts: dict[int, int]) -> list[Row]:
    reason = unavailable_reason()
    if reason is not None:
        raise Needs(reason)
    plan = compile_plan(ctx.root / f"graphs/{graph}.yaml", ctx.root / f"bench-results/plans/{graph}-{placement}.plan.bin",
                        "--preset", "tiny", "--placement", placement)
    send = _request(graph)
    log = ctx.root / f"bench-results/logs/network-{graph}.log"
    with Network(1 + max(hosts.values())) as net, tempfile.TemporaryDirectory() as tmp, \
            mstar_run(plan, log, f"mstar-run {placement}", 1) as local:
        cluster = Cluster(net, str(plan), keygen(Path(tmp), 1 + len(hosts)), hosts)
        try:
            cluster.wait_ready()

            def across() -> dict[str, float]:
                sent = sum(net.counters(h)[1] for h in range(len(net.hosts)))
                start = time.perf_counter()
                cluster.call(send, cluster.url)
                seconds = time.perf_counter() - start
                return {"s": seconds, "bytes": sum(net.counters(h)[1] for h in range(len(net.hosts))) - sent}

            def one_host() -> dict[str, float]:
                start = time.perf_counter()
                send(local.url)
                return {"s": time.perf_counter() - start}

            samples = ctx.alternate(f"network {graph}", {"across": across, "one": one_host})
        finally:
            cluster.stop()
    return [Row(case, "time per request", "s", LOWER, Side(ACROSS, samples["across"]["s"]),
                Side(ONE_HOST, samples["one"]["s"]), names=("across hosts", "one host"),
                note="advantage below 1: the network's cost"),
            Row(case, "bytes on the wire per request", "B", LOWER, Side(ACROSS, samples["across"]["bytes"]),
                names=("across hosts", "-"), note="sum of every host's eth0 tx bytes")]


@register("network", "the same plan with ranks on other hosts (network namespaces) vs on one host")
def run(ctx: Context) -> list[Row]:
    ctx.settings.update(cases={c: {"graph": g, "placement": p, "remote_hosts": h} for c, (g, p, h) in CASES.items()},
                        threads_per_process=1)
    rows: list[Row] = []
    for case, (graph, placement, hosts) in CASES.items():
        try:
            rows += _case_rows(ctx, case, graph, placement, hosts)
        except Needs as exc:
            ctx.record_needs(case, exc)
    return rows
