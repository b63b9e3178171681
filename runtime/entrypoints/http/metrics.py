"""Prometheus metrics of one server (own registry, so tests can run several in one process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """Every metric the server exports; gauges are refreshed from the conductor at scrape time."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.queue_depth = Gauge("mstar_queue_depth", "requests waiting for admission", registry=r)
        self.running = Gauge("mstar_running_requests", "requests admitted and running", registry=r)
        self.kv_usage = Gauge("mstar_kv_cache_usage", "fraction of KV cache blocks in use (all pools)", registry=r)
        self.batch_size = Histogram("mstar_batch_size", "requests per dispatched batch", ["node"],
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.batch_ms = Histogram("mstar_batch_run_ms", "worker time of one batch (ms)", ["node"],
                                  buckets=(1, 5, 10, 25, 50, 100, 250, 1000, 5000), registry=r)
        self.ttft = Histogram("mstar_time_to_first_token_seconds", "arrival to first output token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("mstar_e2e_request_latency_seconds", "arrival to last output",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.requests = Counter("mstar_requests", "finished requests by reason", ["finish_reason"], registry=r)
        self.rank_requests = Counter("mstar_rank_requests", "ended requests that ran a node on a rank (last rank)",
                                     ["rank", "node"], registry=r)
        self.generated = Counter("mstar_generated_tokens", "output tokens", registry=r)
        self.kv_peak_usage = Gauge("mstar_kv_cache_peak_usage", "highest fraction of one KV pool ever held",
                                   registry=r)
        self.kv_preemptions = Gauge("mstar_kv_preemptions", "requests preempted for KV room (context recomputed later)",
                                    registry=r)
        self.kv_holds = Gauge("mstar_kv_admission_holds", "admissions held back until KV blocks were free",
                              registry=r)
        self.worker_restarts = Gauge("mstar_worker_restarts", "restarts of local worker processes", registry=r)
        self.dropped = Gauge("mstar_dropped_messages", "control/data-plane messages dropped as malformed or forged",
                             ["receiver"], registry=r)
        self.split_batches = Gauge("mstar_split_batches", "shared batches that failed; their requests retried "
                                   "one by one, so only the one that broke the batch fails", registry=r)
        self.refused = Gauge("mstar_refused_peers", "ZeroMQ handshakes refused (no or unknown CURVE key)",
                             registry=r)
        self.threads = Gauge("mstar_worker_threads", "OpenMP threads a rank runs now: fewer than it was given "
                             "while other processes keep cores busy (runtime/worker/openmp.py)", ["rank"], registry=r)
        self.threads_allotted = Gauge("mstar_worker_threads_allotted", "OpenMP threads a rank was given", ["rank"],
                                      registry=r)

    def observe_batch(self, node: str, size: int, run_ms: float) -> None:
        self.batch_size.labels(node).observe(size)
        self.batch_ms.labels(node).observe(run_ms)

    def render(self, stats: dict[str, float]) -> bytes:
        self.queue_depth.set(stats["waiting"])
        self.running.set(stats["running"])
        self.kv_usage.set(stats["kv_usage"])
        self.kv_peak_usage.set(stats.get("kv_peak_usage", 0.0))
        self.kv_preemptions.set(stats.get("kv_preemptions", 0))
        self.kv_holds.set(stats.get("kv_holds", 0))
        self.worker_restarts.set(stats.get("restarts", 0))
        self.refused.set(stats.get("refused_peers", 0))
        self.split_batches.set(stats.get("split_batches", 0))
        for receiver, count in stats.get("dropped", {}).items():
            self.dropped.labels(receiver).set(count)
        for rank, (now, allotted) in stats.get("threads", {}).items():
            self.threads.labels(rank).set(now)
            self.threads_allotted.labels(rank).set(allotted)
        return generate_latest(self.registry)
