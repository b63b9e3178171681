"""`mstar-run check-weights` and `mstar-run convert-weights`: offline commands on checkpoints.

    mstar-run check-weights plan.bin --weights ROOT [--weights REPO=DIR]
        per node: tensors matched / missing / unexpected / mis-shaped and bytes per rank, from
        safetensors headers and the config files only (modules built on the meta device); exit 1 on
        any mismatch, naming the first offending keys and the fix.
    mstar-run convert-weights DIR
        every .bin/.pt under DIR once into .safetensors beside it (read by runtime/model_executor/weights/torch_zip.py,
        which interprets tensors and containers only and never unpickles); serving reads the converted
        files, never the originals.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

from mstar_compiler.plan import Plan, load_plan
from runtime.model_executor.weights.published import check_published, mismatch_fix
from runtime.model_executor.weights.repository import PICKLE_SUFFIXES
from runtime.model_executor.weights.torch_zip import NotAWeightsFile, read_torch_zip
from runtime.model_executor.weights.sources import WeightOptions, resolve

GIB = 2**30


def main(argv: list[str]) -> int:
    """Entry point for `mstar-run check-weights ...` / `mstar-run convert-weights ...` (argv[0] names which)."""
    if argv[0] == "convert-weights":
        p = argparse.ArgumentParser(prog="mstar-run convert-weights", description=__doc__.split("\n\n")[0])
        p.add_argument("dir", help="directory searched recursively for .bin / .pt / .pth files")
        return 0 if convert_dir(Path(p.parse_args(argv[1:]).dir)) else 1
    p = argparse.ArgumentParser(prog="mstar-run check-weights", description="Check weights against a plan.")
    p.add_argument("plan")
    p.add_argument("--weights", action="append", default=[], metavar="ROOT|REPO=DIR")
    args = p.parse_args(argv[1:])
    return 0 if check_plan(load_plan(args.plan), WeightOptions(tuple(args.weights))) else 1


def check_plan(plan: Plan, options: WeightOptions, out=sys.stdout) -> bool:
    """Print the report of every weight group of `plan`; True when everything matches."""
    from runtime.worker.loader import meta_slots
    ok, per_rank = True, defaultdict(int)
    read: dict[str, set[str]] = defaultdict(set)
    published: dict[str, set[str]] = defaultdict(set)
    for node in plan.nodes:
        if node.weight_key != node.name:
            continue
        source = resolve(plan, node, options)
        if source.kind != "mapped":
            print(f"node {node.name} ({node.kind}): {source.describe()}", file=out)
            continue
        assert node.weight_map is not None and source.path is not None
        root = Path(source.path)
        print(f"node {node.name} ({node.kind}) <- {node.weight_map.source} at {root}", file=out)
        try:
            report = check_published(node, root, meta_slots(node))
        except (ValueError, FileNotFoundError) as exc:
            print(f"  ERROR {exc}", file=out)
            ok = False
            continue
        for note in report.config_notes:
            print(f"  config: {note}", file=out)
        read[source.path].update(report.read | report.excluded)
        published[source.path].update(report.published)
        print(f"  matched {report.matched}, missing {len(report.missing)}, unexpected {len(report.unexpected)}, "
              f"wrong shape {len(report.misshaped)}; {report.nbytes / GIB:.2f} GiB", file=out)
        if not report.is_ok:
            ok = False
            print(f"{report.problems()}\n  fix: {mismatch_fix(node, report)}", file=out)
        for rank in {r for rs in (node.placement.ranks, *node.placement.walk_ranks.values()) for r in rs}:
            per_rank[rank] += report.nbytes // node.placement.tp_size
    ok = _report_unread(published, read, out) and ok
    for rank in sorted(per_rank):
        print(f"rank {rank}: {per_rank[rank] / GIB:.2f} GiB of weights", file=out)
    print("all weights match" if ok else "MISMATCH: the plan would not load (see above)", file=out)
    return ok


def _report_unread(published: dict[str, set[str]], read: dict[str, set[str]], out) -> bool:
    """Tensors of a repository that no node reads (the mapping misses them); False when there are any."""
    ok = True
    for root, names in published.items():
        unread = sorted(names - read[root])
        if unread:
            ok = False
            print(f"{root}: {len(unread)} tensors read by no node: {', '.join(unread[:5])}"
                  f"{' ...' if len(unread) > 5 else ''}\n  fix: map them to a node or `exclude:` them "
                  f"deliberately in the graph preset's `weights:`", file=out)
    return ok


def convert_dir(root: Path, out=sys.stdout) -> bool:
    """Convert every pickle under `root` to safetensors beside it; True when every one was (or already is)."""
    from safetensors.torch import save_file
    pickles = sorted(p for p in root.rglob("*") if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if not pickles:
        print(f"{root}: no .bin / .pt / .pth files", file=out)
    ok = True
    for path in pickles:
        target = path.with_suffix(".safetensors")
        if target.exists():
            print(f"{target}: exists, left as is", file=out)
            continue
        try:
            tensors, skipped = flatten_tensors(read_torch_zip(path))
        except NotAWeightsFile as exc:
            print(f"{path}: not converted, not a checkpoint of tensors: {exc}", file=out)
            ok = False
            continue
        if not tensors:
            print(f"{path}: not converted, it holds no tensors", file=out)
            ok = False
            continue
        tmp = target.with_suffix(".safetensors.tmp")
        # clone: safetensors refuses tensors that share storage, as pickled state dicts may
        save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(tmp),
                  metadata={"converted_from": path.name})
        tmp.rename(target)
        note = f" (skipped {len(skipped)} non-tensor entries: {', '.join(skipped[:5])})" if skipped else ""
        print(f"{path} -> {target}: {len(tensors)} tensors{note}", file=out)
    return ok


def flatten_tensors(obj: object, prefix: str = "") -> tuple[dict[str, torch.Tensor], list[str]]:
    """Tensors of a (nested) dict under dotted names, and the names of non-tensor entries."""
    if isinstance(obj, torch.Tensor):
        return {prefix.rstrip("."): obj}, []
    if not isinstance(obj, dict):
        return {}, [prefix.rstrip(".") or "<root>"]
    tensors, skipped = {}, []
    for key, value in obj.items():
        t, s = flatten_tensors(value, f"{prefix}{key}.")
        tensors.update(t)
        skipped += s
    return tensors, skipped
