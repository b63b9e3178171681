"""`mstar-run`: serve a compiled plan, or run one worker rank that joins a running server.

    mstar-run plan.bin [--host 127.0.0.1] [--port 8000 | --port 0 --port-file F] [--api-key KEY]
                       [--max-concurrency N] [--prefill-chunk 256] [--prefill-chunk-alone 1024]
                       [--max-batch-tokens 4096]
                       [--weights ROOT] [--weights REPO=DIR] [--random-weights]
                       [--worker-endpoint tcp://127.0.0.1:0] [--remote-ranks 1,2 --keys DIR]
                       [--batch-invariant] [--no-prefix-cache]
                       [--ray [ADDRESS] [--ray-cpus-per-rank 1] [--ray-strategy PACK]   # ranks as Ray actors
                        [--ray-allow-unauthenticated]]      # else the cluster must check Ray tokens
    mstar-run worker --conductor tcp://HOST:PORT --rank R --key rank-R.json plan.bin [--weights ROOT ...]
                     [--host BIND] [--advertise ADDRESS]
    mstar-run keygen --ranks N --out DIR      CURVE keys for a cluster with remote ranks (server `--keys DIR`)
    mstar-run check-weights plan.bin --weights ROOT [--weights REPO=DIR]   # headers only; exit 1 on mismatch
    mstar-run convert-weights DIR        # .bin/.pt -> .safetensors beside them, once, offline
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from mstar_compiler.plan import PlanFormatError
from runtime.ranks.ray import ClusterError
from runtime.worker.cli import setup_logging, weight_args, weight_options, worker_main

if TYPE_CHECKING:
    from runtime.ranks.ray.ray_launcher import RayOptions


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mstar-run", description="Serve a compiled mstar plan over HTTP.")
    p.add_argument("plan", help="plan.bin from `mstarc compile`")
    p.add_argument("--host", default="127.0.0.1",
                   help="HTTP bind address (default 127.0.0.1); local workers bind and advertise it too, so "
                        "ranks on other hosts reach them")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000; 0: a free one the system picks)")
    p.add_argument("--port-file", default=None, metavar="PATH",
                   help="write the bound HTTP port to PATH once serving (with --port 0: how a supervisor or a "
                        "test learns it without racing other processes for a port it picked)")
    p.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on /v1/* and /metrics; /health then shows worker "
                        "pids and ranks only with the key")
    p.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key")
    p.add_argument("--max-concurrency", type=int, default=256, help="requests admitted at once; more wait")
    p.add_argument("--max-queue", type=int, default=1024,
                   help="requests waiting for admission at once; more are answered 429 with Retry-After")
    weight_args(p)
    p.add_argument("--worker-endpoint", default="tcp://127.0.0.1:0",
                   help="where workers connect (a fixed port lets `mstar-run worker` join from elsewhere)")
    p.add_argument("--remote-ranks", default="", help="comma-separated ranks started by hand with `mstar-run worker`")
    p.add_argument("--keys", default=None,
                   help="directory from `mstar-run keygen` (required with --remote-ranks); default: fresh CURVE "
                        "keys for this start, handed to local workers in 0600 files")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds before a request is aborted")
    p.add_argument("--ready-timeout", type=float, default=300.0, metavar="S",
                   help="at start, how long a worker may go without a start step (weights loaded, a decode step "
                        "compiled or captured) before the server gives up (default 300)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="run every node for one request at a time and never merge batches: no output then "
                        "depends on what else is running or on the placement, bit for bit, unless a node is split "
                        "by tensor parallelism (CPU GEMMs pick other kernels for other row counts); costs the "
                        "throughput of cross-request batching")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                   help="compute every prompt in full: no reuse of the KV blocks of a prefix an earlier request "
                        "(a shared system prompt, the previous turns of a chat) already computed")
    p.add_argument("--prefill-chunk", type=int, default=256, metavar="TOKENS",
                   help="cut prompts longer than this into chunks that run in the same batches as the decoding "
                        "requests, so they keep receiving tokens while a long prompt prefills (0: whole prompts)")
    p.add_argument("--prefill-chunk-alone", type=int, default=1024, metavar="TOKENS",
                   help="the chunk of a prompt whose request is the only one in the server: no other request waits "
                        "on it, and fewer, larger forwards are faster; a request arriving meanwhile waits for at most "
                        "one such chunk (0: --prefill-chunk whatever else runs)")
    p.add_argument("--max-batch-tokens", type=int, default=4096, metavar="ROWS",
                   help="rows one batch of a node computes: an LM's new tokens (prompt chunks and decode rows), an "
                        "encoder's rows (the placeholders of the pictures or utterances it reads), so one call's "
                        "activations stay near what the memory plan keeps free (a larger item runs alone)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _ray_args(p)
    return p


def _ray_args(p: argparse.ArgumentParser) -> None:
    from runtime.ranks.ray.bundles import STRATEGIES
    p.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                   help="start each rank in a Ray actor on a running Ray cluster (ADDRESS: its head's host:port; "
                        "without it $RAY_ADDRESS or the cluster on this host); needs `pip install mstar[cluster]`")
    p.add_argument("--ray-cpus-per-rank", type=float, default=1.0, help="CPUs each rank's actor reserves")
    p.add_argument("--ray-strategy", default="PACK", choices=STRATEGIES,
                   help="how ranks outside a tensor-parallel group spread over the nodes (a TP group always "
                        "shares one node)")
    p.add_argument("--ray-allow-unauthenticated", action="store_true",
                   help="serve on a Ray cluster that does not check tokens (RAY_AUTH_MODE=token is off), where "
                        "anyone who reaches it can run code in every rank; logged as a warning and shown in /health")


def _ray_options(args: argparse.Namespace) -> RayOptions | None:
    from runtime.ranks.ray.ray_launcher import RayOptions
    return None if args.ray is None else RayOptions(args.ray, args.ray_cpus_per_rank, args.ray_strategy,
                                                    allow_unauthenticated=args.ray_allow_unauthenticated)


def _keygen(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="mstar-run keygen", description="Write CURVE keys for a serving cluster.")
    p.add_argument("--ranks", type=int, required=True, help="number of ranks of the plan")
    p.add_argument("--out", required=True, help="directory to write server.json and rank-<k>.json into (0700)")
    args = p.parse_args(argv)
    from runtime.transport.keys import write_cluster_keys
    for path in write_cluster_keys(args.out, args.ranks):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "keygen":
            return _keygen(argv[1:])
        if argv and argv[0] == "worker":
            return worker_main(argv[1:])
        if argv and argv[0] in ("check-weights", "convert-weights"):
            from runtime.entrypoints.weights_cli import main as weights_main
            return weights_main(argv)
        parser = _serve_parser()
        args = parser.parse_args(argv)
        if args.prefill_chunk < 0:
            parser.error(f"--prefill-chunk must be 0 (whole prompts) or a positive number of tokens, "
                         f"got {args.prefill_chunk}")
        if args.max_batch_tokens < 1:
            parser.error(f"--max-batch-tokens must be a positive number of rows, got {args.max_batch_tokens}")
        if args.prefill_chunk_alone < 0:
            parser.error(f"--prefill-chunk-alone must be 0 (--prefill-chunk) or a positive number of tokens, "
                         f"got {args.prefill_chunk_alone}")
        setup_logging(args.log_level)
        from runtime.entrypoints.http.app import serve
        from runtime.entrypoints.http.context import ServerConfig
        remote = frozenset(int(r) for r in args.remote_ranks.split(",") if r.strip())
        if remote and not args.keys:
            print("mstar-run: --remote-ranks needs --keys DIR: run `mstar-run keygen --ranks N --out DIR` and hand "
                  "each remote host its rank-<k>.json", file=sys.stderr)
            return 2
        serve(ServerConfig(plan_path=args.plan, host=args.host, port=args.port, port_file=args.port_file,
                           api_key=args.api_key,
                           metrics_public=args.metrics_public, max_queue=args.max_queue,
                           max_concurrency=args.max_concurrency, weights=weight_options(args),
                           log_level=args.log_level, worker_endpoint=args.worker_endpoint,
                           remote_ranks=remote, request_timeout_s=args.request_timeout,
                           ready_timeout_s=args.ready_timeout,
                           batch_invariant=args.batch_invariant, prefix_cache=args.prefix_cache,
                           prefill_chunk_tokens=args.prefill_chunk,
                           prefill_chunk_alone_tokens=args.prefill_chunk_alone,
                           max_batch_tokens=args.max_batch_tokens,
                           keys_dir=args.keys, ray=_ray_options(args)))
        return 0
    except (PlanFormatError, ClusterError) as exc:
        print(f"mstar-run: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as exc:
        from runtime.model_executor.weights import WEIGHT_ERRORS
        if not isinstance(exc, WEIGHT_ERRORS):
            raise
        print(f"mstar-run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
