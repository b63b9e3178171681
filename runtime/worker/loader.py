"""Builds the modules of one rank's nodes, once per weight group.

Nodes with the same `weight_key` (`same_as` in YAML) on one rank share one module; each
still gets its own executor, hence its own KV cache. Weights come from, in order: the
`--weights DIR` override (DIR/<weight_key>, or DIR itself when the plan has one weight
group), the graph preset's `weights:` source (plan `Node.weights`), or a seeded random init (`seed` arg) — reported back as
the node's weight source.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch

from mstar_compiler.plan import Node, Plan
from runtime.components import component_class

log = logging.getLogger(__name__)

def weight_source(plan: Plan, node: Node, weights_dir: str | None) -> str | None:
    """Checkpoint reference for `node` (path or gguf:<package>), None for seeded random weights."""
    if weights_dir:
        groups = {n.weight_key for n in plan.nodes}
        candidate = Path(weights_dir) / node.weight_key
        if candidate.exists():
            return str(candidate)
        if len(groups) == 1:
            return weights_dir
    ref = node.weights or node.args.get("weights")
    return str(ref) if ref else None


def describe_source(node: Node, ref: str | None) -> str:
    """What `/v1/models` says about a node's weights."""
    return ref if ref else f"seed:{int(node.args.get('seed', 0))}"


def _is_gguf(ref: str) -> bool:
    return ref.startswith("gguf:") or ref.endswith(".gguf") or (
        os.path.isdir(ref) and any(Path(ref).glob("*.gguf")))


def build_module(node: Node, ref: str | None) -> torch.nn.Module:
    """The node's module with weights from `ref` (or its seed)."""
    cls = component_class(node.kind)
    args: dict[str, Any] = dict(node.args)
    if ref is not None and _is_gguf(ref):
        ref = gguf_as_safetensors(ref)
    return cls(node.dims, {**args, "weights": ref}).eval()


def gguf_as_safetensors(ref: str) -> str:
    """A safetensors copy of a GGUF's de-quantised HF state dict, written once and reused.

    De-quantising costs seconds on every start and components read safetensors; the copy
    lives in $MSTAR_CACHE (default ~/.cache/mstar) keyed by the GGUF's path, size and mtime.
    """
    from safetensors.torch import save_file

    from runtime.weights.gguf_loader import open_gguf, resolve_gguf
    path = resolve_gguf(ref)
    stat = path.stat()
    cache = Path(os.environ.get("MSTAR_CACHE", Path.home() / ".cache" / "mstar"))
    digest = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache / f"{path.stem}-{digest}.safetensors"
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        save_file({k: v.contiguous() for k, v in open_gguf(ref).state_dict().items()}, str(tmp))
        tmp.rename(target)
    return str(target)


def rank_device(rank: int) -> torch.device:
    """The device a rank's modules live on: its own CUDA device when there are any, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def load_rank(plan: Plan, rank: int, weights_dir: str | None) -> dict[str, tuple[torch.nn.Module, str]]:
    """node name -> (module, weight source) for every node of `rank`, on the rank's device."""
    torch.manual_seed(0)
    device = rank_device(rank)
    by_key: dict[str, torch.nn.Module] = {}
    out: dict[str, tuple[torch.nn.Module, str]] = {}
    for name in plan.ranks[rank].nodes:
        node = plan.node(name)
        ref = weight_source(plan, node, weights_dir)
        if node.weight_key not in by_key:
            log.info("rank %d: loading %s (%s) from %s", rank, name, node.kind, describe_source(node, ref))
            by_key[node.weight_key] = build_module(node, ref).to(device)
        out[name] = (by_key[node.weight_key], describe_source(node, ref))
    return out
