"""Benchmark suite of mstar: each comparison against an honestly named baseline.

    python tools/bench.py [suite ...] [--rounds N] [--quick] [--out bench-results]
    python tools/bench.py --list            # suites and what they compare
    python tools/bench.py --render          # re-render table and plots from saved JSON
    python tools/bench.py --publish         # the newest JSON of each suite into docs/bench-results/, its table
                                            # into docs/benchmarks.md (the repository's current figures)
    python tools/bench.py chat --vllm VENV/bin/vllm   # the vLLM peer from its own venv (docs/benchmarks.md)
    python tools/bench.py chat --llamacpp PATH        # the llama.cpp peer: llama-server or the xllamacpp venv

Suites: chat, rollout, cfg, tts, stack, sched, linear, speech, prefix, bound, threads, network, realtime,
prefill, cascade, ... (`--list`; default: all).
Each run writes bench-results/<suite>-<time>.json; then bench-results/latest.md (the markdown table of
the newest run of every suite) and bench-results/plots/*.png are rendered from the saved
JSON. Sides alternate in ABBA order (A B, B A, ...); figures are medians with [min-max] over the rounds.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import signal
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT))
from runtime.worker.openmp import worker_waits  # noqa: E402

# in-process sides (bare decode loops, HF generate) get a worker's OpenMP wait policy (brief spins,
# runtime/worker/openmp.py), so they wait between parallel regions as the served worker does
SET_HERE = {"GOMP_SPINCOUNT"} if worker_waits(os.environ) else set()

from bench import plots, quiet, report, results  # noqa: E402
from bench.servers import BENCH_SET  # noqa: E402

BENCH_SET.update(SET_HERE)
from bench.registry import Context, Needs, suites  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="mstar benchmark suite (medians over ABBA rounds)")
    parser.add_argument("suites", nargs="*", help="suites to run (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="recorded A/B rounds per comparison")
    parser.add_argument("--quick", action="store_true", help="smaller cases (smoke runs)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results", help="results directory")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads of in-process sides (default: torch's; 1 on a busy shared machine)")
    parser.add_argument("--vllm", type=Path, default=None,
                        help="vLLM CPU peer: its venv's bin/vllm (or bin/python, or the venv) "
                             "(default: .bench/vllm-venv of tools/setup_vllm_cpu.sh)")
    parser.add_argument("--llamacpp", type=Path, default=None,
                        help="llama.cpp peer: a llama-server binary or the venv holding xllamacpp (default: "
                             ".bench/llama.cpp/build/bin/llama-server if built, else .bench/llamacpp-venv of "
                             "tools/setup_llamacpp.sh)")
    parser.add_argument("--cpu-compile", action="store_true",
                        help="mstar's SmolLM2 plans compile their decode steps (the lm node's `cpu_compile: true`; "
                             "a cold start compiles for minutes)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="the model dtypes of the suites that compare several (chat), comma-separated")
    parser.add_argument("--settle", type=float, default=quiet.TIMEOUT_S,
                        help="before each measured run, wait up to this many seconds for the machine's CPUs to go "
                             "idle (a side's threads may spin after its run); 0: no wait")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    parser.add_argument("--render", action="store_true", help="only re-render table and plots")
    parser.add_argument("--publish", action="store_true",
                        help="only copy the newest JSON of each suite into docs/bench-results/ and write its table "
                             "into docs/benchmarks.md (what the repository states as current)")
    return parser.parse_args(argv)


def run_suite(name: str, args: argparse.Namespace, command: str) -> results.RunRecord:
    """Run one suite and return its record (a missing part becomes a `needs` entry)."""
    suite = suites()[name]
    if args.threads is not None:
        import torch
        torch.set_num_threads(args.threads)
    ctx = Context(rounds=args.rounds, quick=args.quick, root=ROOT, threads=args.threads, vllm=args.vllm,
                  llamacpp=args.llamacpp, cpu_compile=args.cpu_compile, settle_s=args.settle, dtypes=tuple(args.dtypes.split(",")))
    record = results.RunRecord(name, suite.title, command, args.rounds, results.now(),
                               machine=results.machine_info(ROOT))
    try:
        record.rows = suite.run(ctx)
    except Needs as exc:
        ctx.record_needs("all cases", exc)
    if ctx.settle_waits:
        waits = sorted(ctx.settle_waits)
        ctx.settings["settle"] = {"max_wait_s": ctx.settle_s, "runs": len(waits), "median_wait_s": waits[len(waits) // 2],
                                  "longest_wait_s": waits[-1],
                                  "never_quiet": sum(w >= ctx.settle_s for w in waits)}   # measured on a busy machine
    record.finished, record.settings, record.needs = results.now(), ctx.settings, ctx.needs
    return record


def render(out: Path) -> str:
    """Re-render latest.md and the plots from the newest JSON of each suite."""
    records = results.latest(out, list(suites()))
    figures: dict[str, list[str]] = {}
    if importlib.util.find_spec("matplotlib") is None:
        print("no plots: matplotlib is missing (pip install -e '.[bench]')", file=sys.stderr)
    else:
        figures = {r.suite: [str(p.relative_to(out)) for p in plots.plot_record(r, out / "plots")]
                   for r in records}
    text = report.render(records, figures)
    (out / "latest.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the servers a suite started are stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    known = suites()
    if args.list:
        for s in known.values():
            print(f"{s.name:8s} {s.title}")
        return 0
    unknown = [s for s in args.suites if s not in known]
    if unknown:
        print(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    command = " ".join(["python", "tools/bench.py", *map(shlex.quote, argv)])
    failed = 0
    if args.publish:
        newest = results.latest_paths(args.out, list(known))
        if not newest:
            print(f"nothing to publish: no result files under {args.out}", file=sys.stderr)
            return 1
        copied = report.publish(newest, DOCS)
        print(f"docs/benchmarks.md: the table of {len(copied)} suites; raw JSON in docs/bench-results/",
              file=sys.stderr)
        return 0
    for name in [] if args.render else (args.suites or list(known)):
        try:
            path = results.write(run_suite(name, args, command), args.out)
            print(f"{name}: wrote {path}", file=sys.stderr)
        except Exception:  # one broken suite must not lose the others' results
            traceback.print_exc()
            print(f"{name}: FAILED (traceback above)", file=sys.stderr)
            failed += 1
    print(render(args.out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
