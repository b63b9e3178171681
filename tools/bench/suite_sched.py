"""sched: the conductor's own cost, time per scheduled step at 1, 64 and 512 live requests,
with components that do no work (so only scheduling, batching and messaging are timed).

This is a plain measurement (no baseline peer exists): the figure is how many microseconds
one `Conductor.step()` takes as the number of live requests grows, the number that bounds
how small a model mstar can serve without the scheduler dominating.

The conductor runs the tiny smollm2 plan against `runtime.conductor.null_workers.NullWorkers`, which
answer every RunBatch at once with one token through the real transport messages, so the
requests stay alive (long decode loops) and each timed `step()` is schedule + dispatch +
apply. The steps are timed from outside, around `await step()`, on two clocks: wall time
(`time.perf_counter`) and the conductor thread's CPU time (`time.thread_time`). On a shared
machine the wall figure also holds the time other processes took the core from it; the CPU
figure is the conductor's own work, so it is the one that reproduces across runs.
A third row times one `/v1/state` snapshot of the same requests: the page's live feed
builds at most four a second, so its cost per second is bounded by 4x that figure.
A fourth counts the work instead of timing it: Python opcodes the interpreter executes per
step (a `sys.settrace` opcode trace over `TRACED_STEPS` steps, run apart from the timed ones).
The count is the same on any machine and any load (but for a few opcodes of the conductor's
time-based checks), so a change to the conductor's hot path shows in it when the timed rows
are lost in a shared machine's noise; per decode row it is the step's count minus the
1-live count, divided by the rows.
Every case runs the conductor's own block tables (`KVPoolLedger`: each Run grown and told what
changed in its table). The last case runs the 512 with the pool caching prefixes, as a served LM's
pool does by default (`--no-prefix-cache` turns it off): each decode row's token is also kept for
its block's key, and a filled block is hashed and registered.
"""
from __future__ import annotations

import asyncio
import sys
import time

from bench.registry import Context, Needs, register
from bench.results import Row, Side
from bench.stats import LOWER
from runtime.transport.request_params import RequestParams

LIVE_REQUESTS = (1, 64, 512)
STEPS = 200                # timed steps per round
SNAPSHOTS = 20             # timed /v1/state snapshots per round
TRACED_STEPS = 20          # steps whose opcodes are counted per round (tracing runs ~50x slower)
MAX_TOKENS = 8192          # decode loops far longer than a run: every request stays live
PREFIX_ROOT = bytes(16)     # the "prefix cache" case: the pool caches prefixes, as a served LM's does by default
LABEL = "mstar Conductor.step() with null workers (tiny smollm2 plan, one lm node, batch {batch})"
NOTE = "absolute figure: there is no baseline peer for the conductor's own cost"


class NullConductor:
    """A conductor of `live` decode loops answered instantly by null workers."""

    def __init__(self, ctx: Context, live: int, prefix_cache: bool = False) -> None:
        try:
            from mstar_compiler.ir import Options
            from mstar_compiler.pipeline import compile_file
            from runtime.conductor.conductor import Conductor
            from runtime.conductor.config import ConductorConfig
            from runtime.conductor.scheduler import SchedulerConfig
            from runtime.conductor.null_workers import NullWorkers
        except ImportError as exc:
            raise Needs(f"the conductor and its null worker (runtime/conductor/null_workers.py): {exc}") from exc
        plan = compile_file(str(ctx.root / "graphs/smollm2.yaml"), Options(preset="tiny")).plan
        config = ConductorConfig(plan_path="null", scheduler=SchedulerConfig(max_running=max(live, 256)))
        self.loop = asyncio.new_event_loop()
        self.conductor = Conductor(plan, config)
        self.workers = NullWorkers(self.conductor, prefix_root=PREFIX_ROOT if prefix_cache else None)
        self.batch = plan.node("lm").max_batch
        self.reqs = [self.conductor.submit("chat", RequestParams(declared={"max_tokens": MAX_TOKENS}), [("text", list(range(1, 9)))])
                     for _ in range(live)]
        self.loop.run_until_complete(self._steps(2 * (live // self.batch + 2)))   # every prompt prefilled

    async def _steps(self, n: int, trace=None) -> tuple[float, float]:
        """(wall seconds, conductor-thread CPU seconds) of `n` steps, each traced by `trace` if
        given. Between steps, untimed and untraced, each request's events are taken as a server's
        stream reader takes them: left to pile up (thousands per request over a run), they made
        every garbage collection scan them, a cost no server has."""
        wall = cpu = 0.0
        previous = sys.gettrace()
        for _ in range(n):
            wall_start, cpu_start = time.perf_counter(), time.thread_time()
            if trace is not None:
                sys.settrace(trace)
            try:
                await self.conductor.step()
            finally:
                sys.settrace(previous)
            wall += time.perf_counter() - wall_start
            cpu += time.thread_time() - cpu_start
            for req in self.reqs:
                events = req.events
                while not events.empty():
                    events.get_nowait()
        return wall, cpu

    def measure(self) -> dict[str, float]:
        rows, before = self.workers.rows, [len(r.output_ids) for r in self.reqs]
        seconds, cpu_seconds = self.loop.run_until_complete(self._steps(STEPS))
        live = sum(1 for r in self.reqs if not r.state.is_final)
        if live != len(self.reqs):
            raise Needs(f"requests to stay live through the run: {len(self.reqs) - live} ended early")
        advanced = sum(1 for r, n in zip(self.reqs, before) if len(r.output_ids) > n)
        return {"us": seconds / STEPS * 1e6, "cpu_us": cpu_seconds / STEPS * 1e6,
                "per_req": cpu_seconds / STEPS * 1e6 / live,
                "rows": (self.workers.rows - rows) / STEPS, "advanced": advanced, "snapshot_us": self._snapshot_us(),
                "opcodes": self.opcodes_per_step(TRACED_STEPS)}

    def opcodes_per_step(self, steps: int) -> float:
        """Python opcodes executed per `step()` over `steps` steps (the work, not its time)."""
        count = 0

        def trace(frame, event, arg):
            nonlocal count
            if event == "call":
                frame.f_trace_opcodes = True
            elif event == "opcode":
                count += 1
            return trace
        self.loop.run_until_complete(self._steps(steps, trace))
        return count / steps

    def _snapshot_us(self) -> float:
        """One /v1/state snapshot of these requests (built at most 4 times a second, outside step())."""
        start = time.perf_counter()
        for _ in range(SNAPSHOTS):
            self.conductor.live.snapshot(self.conductor)
        return (time.perf_counter() - start) / SNAPSHOTS * 1e6

    def close(self) -> None:
        for req in self.reqs:
            self.conductor.abort(req)
        self.loop.close()


def _rows(live: int, label: str, samples: dict[str, list[float]], prefix_cache: bool = False) -> list[Row]:
    case, series = (f"{live} live, prefix cache", "-prefix") if prefix_cache else (f"{live} live", "")
    rows_per_step = sum(samples["rows"]) / len(samples["rows"])
    advanced = min(samples["advanced"])
    note = f"{NOTE}; {rows_per_step:.1f} rows per step; {advanced:.0f} of {live} requests got a token while timed"
    return [Row(case, "conductor CPU time per step (thread time)", "µs", LOWER, Side(label, samples["cpu_us"]),
                plot="step" + series, x=live, xlabel="live requests", note=note, names=("mstar", "")),
            Row(case, "conductor wall time per step (holds the machine's other load)", "µs", LOWER,
                Side(label, samples["us"]), plot="step-wall" + series, x=live, xlabel="live requests",
                names=("mstar", "")),
            Row(case, "conductor CPU time per step per live request", "µs", LOWER, Side(label, samples["per_req"]),
                plot="per-request" + series, x=live, xlabel="live requests", names=("mstar", "")),
            Row(case, "one /v1/state snapshot (at most 4 per second, shared by every viewer)", "µs", LOWER,
                Side(label, samples["snapshot_us"]), plot="snapshot" + series, x=live, xlabel="live requests",
                names=("mstar", "")),
            Row(case, "conductor Python opcodes per step (the work: the same on any machine)", "opcodes", LOWER,
                Side(label, samples["opcodes"]), plot="opcodes" + series, x=live, xlabel="live requests",
                names=("mstar", ""))]


@register("sched", "conductor time per scheduled step at 1 / 64 / 512 live requests, components doing no work")
def run(ctx: Context) -> list[Row]:
    ctx.settings.update(live_requests=list(LIVE_REQUESTS), steps_per_round=STEPS, max_tokens=MAX_TOKENS,
                        baseline="none: absolute figures and their per-request scaling")
    rows: list[Row] = []
    # plain KV pools at each size, then the largest with the prefix cache's mirror (a served LM's default)
    cases = [(1, False), (8, False), (8, True)] if ctx.quick else [*((n, False) for n in LIVE_REQUESTS),
                                                                   (LIVE_REQUESTS[-1], True)]
    for live, prefix_cache in cases:
        harness = NullConductor(ctx, live, prefix_cache)
        try:
            name = f"sched {live} live" + (", prefix cache" if prefix_cache else "")
            samples = ctx.alternate(name, {"mstar": harness.measure})["mstar"]
        finally:
            harness.close()
        rows.extend(_rows(live, LABEL.format(batch=harness.batch), samples, prefix_cache))
    return rows
