"""`mstar-run worker`: run one rank of a plan and join a running server's conductor.

    mstar-run worker --conductor tcp://HOST:PORT --rank R --key rank-R.json plan.bin [--weights ROOT ...]
                     [--host BIND] [--advertise ADDRESS] [--threads N]

`runtime/entrypoints/cli.py` hands it the arguments after `worker`; a Ray actor (runtime/ranks/ray/rank_actor.py)
calls `worker_main` in its own process. The `--weights` flags are shared with the server's command line.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from mstar_compiler.plan import PlanFormatError

if TYPE_CHECKING:
    from runtime.model_executor.weights.sources import WeightOptions


def worker_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mstar-run worker", description="Run one rank and join a conductor.")
    p.add_argument("plan", help="the same plan.bin the server serves")
    p.add_argument("--conductor", required=True, help="the server's worker endpoint, tcp://HOST:PORT")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--key", default=None, help="this rank's key file (rank-R.json from `mstar-run keygen`)")
    weight_args(p)
    p.add_argument("--host", default=None,
                   help="address this worker's tensor inbox binds (0.0.0.0: every interface; default: the "
                        "address of the interface that routes to the conductor)")
    p.add_argument("--advertise", default=None,
                   help="address other ranks dial to reach this worker (default: --host when it names one "
                        "interface, else the interface that routes to the conductor); set it behind NAT")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's; the server gives its local workers "
                        "an equal share of the CPU cores)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def weight_args(p: argparse.ArgumentParser) -> None:
    """The `--weights` and `--random-weights` flags (the server's and the worker's command lines)."""
    p.add_argument("--weights", action="append", default=[], metavar="ROOT|REPO=DIR",
                   help="ROOT: one directory per published repository, named after it (ROOT/orpheus-3b-0.1-ft/, "
                        "as `huggingface-cli download REPO --local-dir ROOT/NAME` leaves it); REPO=DIR: that "
                        "repository from DIR; repeatable")
    p.add_argument("--random-weights", action="store_true",
                   help="seeded random weights for nodes given none (reported in the log, /v1/models, /health)")


def weight_options(args: argparse.Namespace) -> WeightOptions:
    from runtime.model_executor.weights.sources import WeightOptions   # torch: not before the worker's OpenMP settings
    return WeightOptions(tuple(args.weights), args.random_weights)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def worker_main(argv: list[str]) -> int:
    """Serve one rank until the conductor shuts it down; the exit status (1: no conductor or no route
    to it, 2: a plan or weights that cannot serve, said on stderr)."""
    args = worker_parser().parse_args(argv)
    setup_logging(args.log_level)
    from runtime.worker.openmp import worker_waits
    worker_waits(os.environ)      # before torch loads: idle OpenMP threads spin briefly, then sleep
    from runtime.transport.addresses import NoRouteError
    from runtime.model_executor.weights import WEIGHT_ERRORS
    from runtime.worker.worker import run_worker
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        run_worker(args.plan, args.rank, args.conductor, weight_options(args), args.host, args.key, args.advertise)
    except (TimeoutError, NoRouteError) as exc:   # no conductor answered, or no route to it: said, not traced
        print(f"mstar-run worker: {exc}", file=sys.stderr)
        return 1
    except (PlanFormatError, *WEIGHT_ERRORS) as exc:
        print(f"mstar-run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
