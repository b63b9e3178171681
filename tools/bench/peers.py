"""A served side of a comparison: a started server, what it says about itself, and its cache counters.

The served suites (chat, prefill) start each side through its own module: peer_mstar, peer_vllm,
peer_llamacpp. Each gives a `Peer`: the honest label of its rows, the fields every request body
carries, whether its prefix cache is on and how many prompt tokens it looked up and reused so far
(from its own /metrics), and the settings it runs with as it reports them (threads, binding, kernel
ISA, preloaded libraries, KV budget: recorded in the result JSON's settings, `Peer.record`).
`measured` wraps one run of a side so that its metrics carry the cache counters of that run
(bench.cache_state).
"""
from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bench.cache_state import CACHE_METRICS
from bench.servers import Server

Counters = Callable[[], tuple[int, int]]   # () -> (prompt tokens looked up, prompt tokens reused) so far


@dataclass
class Peer:
    """One started server side."""

    name: str                      # short name of its rows: mstar, vllm, llamacpp, llamacpp-q4_1
    label: str                     # the honest label of its rows
    server: Server
    model: str                     # the model id requests name
    is_cache_enabled: bool         # its prefix cache is on, as it says
    cache_source: str              # where is_cache_enabled and the counters come from
    counters: Counters
    settings: dict[str, Any] = field(default_factory=dict)   # threads, binding, ISA, ... as it reports them
    extra: dict[str, Any] = field(default_factory=dict)      # fields every request body carries

    def record(self) -> dict[str, Any]:
        """What the result JSON keeps of this side."""
        return {"label": self.label, "cache_enabled": self.is_cache_enabled, "cache_source": self.cache_source,
                **self.settings}


def measured(counters: Counters, run: Callable[[], Mapping[str, float]]) -> Callable[[], dict[str, float]]:
    """`run` with the side's cache counters read before and after: its metrics plus CACHE_METRICS of that run."""
    def measure() -> dict[str, float]:
        queries, hits = counters()
        metrics = dict(run())
        queries_after, hits_after = counters()
        return {**metrics, CACHE_METRICS[0]: queries_after - queries, CACHE_METRICS[1]: hits_after - hits}
    return measure


def no_cache() -> tuple[int, int]:
    """The counters of a side that keeps no cache across requests (HF generate's static batch)."""
    return 0, 0


def prometheus_values(text: str, name: str) -> dict[str, float]:
    """Every sample of the Prometheus metric `name` (or its `_total` sample) in a /metrics text: label set -> value."""
    values = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric, _, value = line.rpartition(" ")
        base, _, labels = metric.partition("{")
        if base in (name, name + "_total"):
            values["{" + labels if labels else ""] = float(value)
    return values


def prometheus_total(text: str, name: str) -> int:
    """The sum of a counter over its label sets; 0 when absent (a side with its cache off may export none)."""
    return int(sum(prometheus_values(text, name).values()))


def node_run_s(url: str, nodes: Sequence[str]) -> dict[str, float]:
    """Worker seconds each node's batches took so far on the mstar-run at `url` (its /metrics
    mstar_batch_run_ms sums): the difference over a case is where that case's time went."""
    values = prometheus_values(get_text(url + "/metrics"), "mstar_batch_run_ms_sum")
    return {node: values.get(f'{{node="{node}"}}', 0.0) / 1e3 for node in nodes}


def get_text(url: str, timeout_s: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read().decode()


def process_threads(pid: int) -> dict[str, Any]:
    """A process's thread count and the CPUs it may run on, from /proc (what the kernel says it runs with)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return {"pid": pid, "error": str(exc)}
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return {"pid": pid, "threads": int(fields.get("Threads", "0")),
            "cpus_allowed": fields.get("Cpus_allowed_list", "?").strip()}


def cpu_isa_flags() -> list[str]:
    """This CPU's vector extensions that CPU kernels pick between (from /proc/cpuinfo's flags)."""
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        flags = []
    return [f for f in wanted if f in flags]
