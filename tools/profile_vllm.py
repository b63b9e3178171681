"""The decode-step breakdown of tools/profile_decode.py, for vLLM's CPU build serving the same SmolLM2.

    python tools/profile_vllm.py --vllm /work/vllm-venv/bin/vllm           # batch 1/16/64
    python tools/profile_vllm.py --vllm VENV/bin/vllm --batches 16 --steps 5
    python tools/profile_vllm.py --vllm VENV/bin/vllm --prefill 256,1024   # one prompt's prefill step alone

For each batch size a vLLM server (its own venv, `--profiler-config` with the torch profiler
and a schedule of `--steps` active engine steps) serves the fp32 export of SmolLM2
(.bench/smollm2-135m-fp32, tools/setup_vllm_cpu.sh). `batch` streamed chats with long forced
outputs decode; once every one of them has sent tokens, POST /start_profile, so the profiled
steps are all decode steps of the whole batch; POST /stop_profile writes the engine core's
trace. From the trace: each `ProfilerStep#` range is one engine step (its wall time, Python
and scheduling included); the self time of the ops inside it goes to a category by op name
and shape: linears (mm/addmm/linear and vLLM's oneDNN GEMMs), the LM head (the GEMM whose
weight has the vocabulary's rows), attention (vLLM's CPU attention ops and the KV cache
write), RoPE/norms, sampling; "other ops" is every other op. vLLM runs its model
torch.compile'd: inductor's fused kernels (RMSNorms, RoPE, SiLU*up, residual adds) are no
profiled ops, so the time inside its compiled graph that no op accounts for is "fused
kernels"; "outside ops" is the rest of the step (Python, scheduling, waiting between ops).

With `--prefill N,...` the profiled step is instead the first engine step of one N-token prompt
sent to the idle server (new to its prefix cache): its prefill, whole when vLLM's chunked-prefill
budget takes N tokens in one step.
"""
from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from bench import prefill_load  # noqa: E402
from bench.registry import Context  # noqa: E402
from bench.servers import Server, free_port  # noqa: E402
from bench.profile_table import table  # noqa: E402
from bench.peer_vllm import vllm_python  # noqa: E402

CATEGORIES = ("linears", "lm_head", "attention", "rope_norms", "sampling", "other ops", "fused kernels",
              "outside ops")
GRAPH = "## Call CompiledFxGraph"   # vLLM's torch.compile'd model: its inductor kernels are no profiled ops
VOCAB = 49152   # SmolLM2's vocabulary: the LM head's GEMM has this many output columns


def category(name: str, shapes: Any) -> str:
    """The category of one op by its name (and shapes, to tell the LM head from the other GEMMs)."""
    low = name.lower()
    if any(k in low for k in ("attn", "attention", "paged", "reshape_and_cache", "kv_cache")):
        return "attention"
    if any(k in low for k in ("rms_norm", "rotary", "rope", "layer_norm")):
        return "rope_norms"
    if any(k in low for k in ("sampl", "argmax", "topk", "top_k", "gumbel")):
        return "sampling"
    if any(k in low for k in ("mm", "linear", "gemm", "matmul", "onednn")):
        return "lm_head" if VOCAB in _dims(shapes) else "linears"
    return "other ops"


def _dims(shapes: Any) -> set[int]:
    if isinstance(shapes, list):
        return set().union(*map(_dims, shapes)) if shapes else set()
    return {shapes} if isinstance(shapes, int) else set()


def breakdown(trace: dict) -> dict[str, float]:
    """ms per engine step in each category, from a chrome trace of whole ProfilerStep ranges."""
    events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"), key=lambda e: (str(e["tid"]), e["ts"]))
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    if not steps:
        raise SystemExit("the trace holds no ProfilerStep ranges: was the profiler schedule set?")
    graphs = [e for e in events if e["name"].startswith(GRAPH) and _inside(e, steps)]
    totals = dict.fromkeys(CATEGORIES, 0.0)
    totals["fused kernels"] = sum(g["dur"] for g in graphs)    # less the ops inside them, below
    for tid in {e["tid"] for e in steps}:
        ops = [e for e in events if e["tid"] == tid and e.get("cat") == "cpu_op"]   # one thread's, by start
        for op, self_us in _self_times(ops):
            if _inside(op, steps):
                totals[category(op["name"], op.get("args", {}).get("Input Dims"))] += self_us
                totals["fused kernels"] -= self_us if _inside(op, graphs) else 0.0
    step_us = sum(s["dur"] for s in steps)
    totals["outside ops"] = max(step_us - sum(totals.values()), 0.0)
    out = {c: v / 1e3 / len(steps) for c, v in totals.items()}
    out["step"] = step_us / 1e3 / len(steps)
    return out


def _inside(event: dict, ranges: list[dict]) -> bool:
    return any(r["ts"] <= event["ts"] < r["ts"] + r["dur"] for r in ranges)


def _self_times(ops: list[dict]) -> list[tuple[dict, float]]:
    """(op, its duration minus its direct children's) for ops of one thread sorted by start."""
    out, stack = [], []     # stack: [op, children's time]
    for op in ops:
        while stack and op["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
            done, child_us = stack.pop()
            out.append((done, done["dur"] - child_us))
        if stack:
            stack[-1][1] += op["dur"]
        stack.append([op, 0.0])
    out += [(done, done["dur"] - child_us) for done, child_us in reversed(stack)]
    return out


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=600).read()


async def _decoding(url: str, batch: int, steps: int) -> None:
    """`batch` concurrent requests decode; once all of them have sent tokens, profile `steps` engine steps."""
    async with prefill_load.session() as http:
        runs = [prefill_load.Background() for _ in range(batch)]
        tasks = [asyncio.create_task(prefill_load.background(
            http, url, "smollm2", prefill_load.prompt_words(prefill_load.WORDS, 48, nonce=i), 1500, r))
            for i, r in enumerate(runs)]
        try:
            while not all(len(r.arrivals) >= 2 for r in runs):
                await asyncio.sleep(0.05)
            await asyncio.to_thread(_post, url + "/start_profile")
            before = min(len(r.arrivals) for r in runs)
            while min(len(r.arrivals) for r in runs) < before + steps + 2:   # the schedule's steps have run
                await asyncio.sleep(0.05)
            await asyncio.to_thread(_post, url + "/stop_profile")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _prefilling(url: str, num_tokens: int) -> None:
    """One new `num_tokens`-token prompt on the idle server, profiled from before it is sent (vLLM's
    `profiler.start()` takes the schedule's warm-up step itself: the prompt's prefill is the active one)."""
    await asyncio.to_thread(_post, url + "/start_profile")
    content = prefill_load.prompt_words(prefill_load.WORDS, num_tokens - 30, nonce=num_tokens)  # ~30: template + nonce
    async with prefill_load.session() as http:
        await prefill_load.timed(http, url, "smollm2", content, max_tokens=2)
    await asyncio.to_thread(_post, url + "/stop_profile")


def vllm_profiled(ctx: Context, steps: int, out: Path) -> Server:
    """vLLM's server with the torch profiler on a schedule of 1 warm-up + `steps` steps, traces in `out`."""
    config = {"profiler": "torch", "torch_profiler_dir": str(out), "torch_profiler_record_shapes": True,
              "torch_profiler_with_stack": False, "warmup_iterations": 1, "active_iterations": steps}
    port = free_port()
    cmd = [str(vllm_python(ctx)), "-m", "vllm.entrypoints.openai.api_server", "--model",
           str(ctx.bench_dir / "smollm2-135m-fp32"), "--served-model-name", "smollm2", "--port", str(port),
           "--max-model-len", "8192", "--dtype", "float32", "--profiler-config", json.dumps(config)]
    env = {"VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    # the prefill suite's --max-model-len, so a start reuses the model it compiled (vLLM's compile cache)
    return Server("vLLM (profiled)", cmd, port, ROOT / "bench-results/logs/vllm-profile.log", env,
                  start_timeout_s=1500.0)


def profile_batch(srv: Server, batch: int, steps: int, out: Path, prefill: int = 0) -> dict[str, float]:
    """Profile `steps` decode steps at `batch` (or the prefill step of one `prefill`-token prompt);
    the breakdown of the engine core's new trace."""
    seen = set(out.rglob("*.json*"))
    asyncio.run(_prefilling(srv.url, prefill) if prefill else _decoding(srv.url, batch, steps))
    deadline, size = time.monotonic() + 300, -1
    while True:      # the trace is written after stop_profile returns: wait until its size settles
        new = [p for p in out.rglob("*.json*") if p not in seen]
        largest = max(new, key=lambda p: p.stat().st_size, default=None)
        if largest is not None and largest.stat().st_size == size:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"vLLM wrote no trace under {out} (see bench-results/logs/vllm-profile.log)")
        size = -1 if largest is None else largest.stat().st_size
        time.sleep(2)
    text = gzip.decompress(largest.read_bytes()) if largest.suffix == ".gz" else largest.read_bytes()
    return breakdown(json.loads(text))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm", type=Path, default=None, help="the vLLM venv's bin/vllm (default: .bench/vllm-venv)")
    p.add_argument("--batches", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--steps", type=int, default=5, help="profiled engine steps per batch size")
    p.add_argument("--out", type=Path, default=Path("/tmp/mstar-vllm-profile"), help="trace directory")
    p.add_argument("--prefill", default="", help="comma-separated prompt lengths: profile each one's prefill step")
    args = p.parse_args(argv)
    ctx = Context(rounds=1, quick=False, root=ROOT, vllm=args.vllm)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.prefill:
        with vllm_profiled(ctx, 1, args.out) as srv:
            rows = {n: profile_batch(srv, 0, 1, args.out, prefill=n) for n in map(int, args.prefill.split(","))}
        print("vLLM CPU engine step (SmolLM2-135M fp32, served): the first step of one new prompt")
        print(table(rows, CATEGORIES, column="tokens"))
        return 0
    with vllm_profiled(ctx, args.steps, args.out) as srv:
        rows = {b: profile_batch(srv, b, args.steps, args.out) for b in map(int, args.batches.split(","))}
    print(f"vLLM CPU engine step (SmolLM2-135M fp32, served), mean of {args.steps} profiled steps")
    print(table(rows, CATEGORIES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
