"""sched: the conductor's own cost, time per scheduled step at 1, 64 and 512 live requests,
with components that do no work (so only scheduling, batching and messaging are timed).

This is a plain measurement (no baseline): the figure is how many microseconds one
`Conductor.step()` takes as the number of live requests grows, the number that bounds
how small a model mstar can serve without the scheduler dominating.

It needs a way to run the conductor against workers whose components return at once —
a null device/worker in the runtime, as the design's "NULL device" habit asks — and a
per-step timing the conductor exposes. Until the runtime has both, the suite reports
what it needs instead of timing the tiny preset's real compute under another name.
"""
from __future__ import annotations

from bench.registry import Context, Needs, register
from bench.results import Row

LIVE_REQUESTS = (1, 64, 512)


def _null_worker_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("runtime.worker.null") is not None


@register("sched", "conductor time per scheduled step at 1 / 64 / 512 live requests, components doing no work")
def run(ctx: Context) -> list[Row]:
    ctx.settings.update(live_requests=list(LIVE_REQUESTS))
    if not _null_worker_available():
        raise Needs("a null worker (runtime/worker/null.py: components that return at once) and a per-step "
                    "time from the conductor (e.g. an `on_step(seconds, live)` hook like its `on_batch`)")
    raise Needs("the null worker exists; wire `runtime.worker.null` into this suite (tools/bench/suite_sched.py)")
