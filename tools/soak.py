"""Soak a running `mstar-run` (not in CI): N minutes of mixed load with aborts and bad requests.

    python tools/soak.py --url http://127.0.0.1:8000 --minutes 30 --concurrency 8 [--api-key KEY]

Each client loops over the workloads the served plan has (streamed chat, images from a
`t2i` task, streamed speech), cutting one request in five off mid-stream and sending one
bad request in ten. Every 10 s it samples the RSS of the server and its workers (pids from
/health, so the key is needed when the server has one). At the end it prints requests by
outcome, the RSS series, growth after warm-up (first sample after a fifth of the run),
the KV usage once idle, and how many requests hung (no answer within --request-timeout).
"""
from __future__ import annotations

import argparse
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import psutil

BAD = [b"{not json", {"messages": [{"role": "wizard", "content": "x"}]}, {"max_tokens": 0},
       {"temperature": float("inf")}, {"top_k": 2**64}]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.headers = {"Content-Type": "application/json",
                        **({"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})}
        card = self.get("/v1/models")["data"][0]
        self.model, tasks = card["id"], set(card["tasks"])
        self.workloads = [w for w, task in (("chat", "chat"), ("chat", "i2t"), ("image", "t2i"), ("speech", "speech"))
                          if task in tasks]
        self.outcomes: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.rss: list[tuple[float, dict[str, float]]] = []

    def get(self, path: str) -> dict:
        req = urllib.request.Request(self.args.url + path, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:     # /health is 503 while a rank restarts
            return json.loads(err.read())

    def post(self, path: str, body: object, cut: bool) -> str:
        data = body if isinstance(body, bytes) else json.dumps(body, allow_nan=True).encode()
        req = urllib.request.Request(self.args.url + path, data, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.args.request_timeout) as resp:
                if cut:
                    resp.read(64)
                    return "aborted by client"
                resp.read()
                return f"{resp.status}"
        except urllib.error.HTTPError as err:
            return f"{err.code}"
        except TimeoutError:
            return "hung"
        except (urllib.error.URLError, ConnectionError) as exc:
            return f"connection error ({type(exc).__name__})"

    def one(self, rng: random.Random) -> str:
        if rng.random() < 0.1:
            bad = rng.choice(BAD)
            body = bad if isinstance(bad, bytes) else {"model": self.model, "messages": [
                {"role": "user", "content": "hi"}], **bad}
            return "bad -> " + self.post("/v1/chat/completions", body, cut=False)
        kind, cut = rng.choice(self.workloads), rng.random() < 0.2
        if kind == "chat":
            body = {"model": self.model, "messages": [{"role": "user", "content": f"tell me about {rng.random()}"}],
                    "max_tokens": rng.randrange(8, 128), "stream": True}
            return f"chat -> {self.post('/v1/chat/completions', body, cut)}"
        if kind == "image":
            body = {"model": self.model, "prompt": "a red cat", "size": "64x64", "steps": 4, "seed": rng.randrange(99)}
            return f"image -> {self.post('/v1/images/generations', body, cut)}"
        body = {"model": self.model, "input": "Hello there, how are you?", "voice": "tara", "stream": True,
                "max_tokens": rng.randrange(70, 400)}
        return f"speech -> {self.post('/v1/audio/speech', body, cut)}"

    def client(self, seed: int, until: float) -> None:
        rng = random.Random(seed)
        while time.monotonic() < until:
            outcome = self.one(rng)
            with self.lock:
                self.outcomes[outcome] += 1

    def sample_rss(self, start: float) -> None:
        health = self.get("/health")
        procs = {"server": psutil.Process(self.args.server_pid)} if self.args.server_pid else {}
        procs.update({f"rank {r}": psutil.Process(pid) for r, pid in health.get("worker_pids", {}).items() if pid})
        self.rss.append((time.monotonic() - start, {k: p.memory_info().rss / 2**20 for k, p in procs.items()}))

    def run(self) -> None:
        start = time.monotonic()
        until = start + self.args.minutes * 60
        threads = [threading.Thread(target=self.client, args=(i, until), daemon=True)
                   for i in range(self.args.concurrency)]
        [t.start() for t in threads]
        while time.monotonic() < until:
            self.sample_rss(start)
            time.sleep(10)
        [t.join(self.args.request_timeout + 30) for t in threads]
        time.sleep(3)
        self.sample_rss(start)
        self.report(start)

    def report(self, start: float) -> None:
        print(f"{sum(self.outcomes.values())} requests in {(time.monotonic() - start) / 60:.1f} min:")
        for outcome, n in sorted(self.outcomes.items()):
            print(f"  {n:7d}  {outcome}")
        print("RSS MiB over time:")
        for t, rss in self.rss:
            print(f"  {t:7.0f} s  " + "  ".join(f"{k} {v:8.1f}" for k, v in sorted(rss.items())))
        warm = next((r for t, r in self.rss if t >= self.args.minutes * 12), self.rss[0][1])
        last = self.rss[-1][1]
        print("RSS growth after warm-up: " + ", ".join(
            f"{k} {100 * (last[k] / warm[k] - 1):+.1f} %" for k in sorted(last) if k in warm))
        metrics = urllib.request.urlopen(urllib.request.Request(self.args.url + "/metrics", headers=self.headers))
        kv = [line for line in metrics.read().decode().splitlines() if line.startswith("mstar_kv_cache_usage ")]
        print(f"KV usage once idle: {kv[0].split()[1] if kv else '?'}; hung requests: "
              f"{sum(n for o, n in self.outcomes.items() if o.endswith('hung'))}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--api-key", default=None)
    p.add_argument("--server-pid", type=int, default=None, help="the mstar-run process, to sample its RSS too")
    p.add_argument("--request-timeout", type=float, default=300)
    Soak(p.parse_args()).run()


if __name__ == "__main__":
    main()
