"""The CPU backend of capture regions: a bucket's decode step compiled by inductor (C++/OpenMP).

Who calls it: `DecodeGraphs` (decode_graphs.py) with `compiled=True`, for a decoder-LM node
whose graph sets `args: {cpu_compile: true}` (runtime/models/decoder_lm/executors.py). The
regions and buckets are the plan's, as for CUDA graphs; only the backend differs: per
bucket, `torch.compile` turns the padded step (forward + LM head, attention through
`PagedDecodeAttention`) into C++ loops that fuse the elementwise chains (RMSNorm, RoPE,
SiLU * up, residual adds, the paged attention itself) between the oneDNN GEMMs, and Python
leaves the step.

Shapes: the batch is static per bucket (padded to it); the block-table width is marked
dynamic, so one compiled kernel serves every context length (no recompile per step).
Compiles are slow (tens of seconds per bucket on a small CPU), so `DecodeGraphs.capture_all`
compiles every bucket at load, before the rank reports Ready, and logs the time each took.
inductor's caches live under ~/.cache/mstar/inductor unless TORCHINDUCTOR_CACHE_DIR says
otherwise: a restart with the same model and torch reuses the compiled kernels.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import torch

CACHE_DIR = Path.home() / ".cache" / "mstar" / "inductor"
COMPILERS = ("g++", "c++", "clang++")    # what inductor's C++ backend can build with


def cpp_compiler() -> str | None:
    """The C++ compiler inductor will build with (its CXX setting, else the first on PATH), or None."""
    configured = os.environ.get("CXX")
    if configured:
        return shutil.which(configured)
    return next((path for name in COMPILERS if (path := shutil.which(name))), None)


def require_cpp_compiler(node: str) -> None:
    """Raise a clear error when compiled steps are asked for and nothing can build them."""
    if cpp_compiler() is None:
        raise RuntimeError(f"node '{node}': args.cpu_compile is on but no C++ compiler was found "
                           f"(looked for $CXX, {', '.join(COMPILERS)}): install one (e.g. apt-get install g++) "
                           "or set cpu_compile: false in the graph")


def compile_step(step: Callable, num_buckets: int) -> Callable:
    """`step` compiled by inductor for static batch shapes; one cache entry per bucket is kept."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE_DIR))
    # every bucket's compile is a cache entry of the same code: room for all of them, and
    # for a few more (another node's steps share the code object too)
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, 4 * num_buckets)
    return torch.compile(step, dynamic=False, fullgraph=True)
