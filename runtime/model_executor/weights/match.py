"""A node's slots against the published tensors its mapping selects: the key-by-key report,
and loading once it is clean.

`match_node` needs only headers (names, shapes, sizes) and the module's slots (a module on the
meta device will do), so `check-weights` and the start-up check cost no tensor data.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch

from runtime.model_executor.weights.headers import TensorInfo, read_tensor
from runtime.model_executor.weights.mapping import CompiledMap, Target, node_tensors
from runtime.model_executor.weights.slots import IGNORED_SUFFIXES, Slot, WeightLoadError

log = logging.getLogger(__name__)
# offending keys a message names before "..."
SHOWN_KEYS = 5


@dataclass
class MatchReport:
    """How one node's slots and its published tensors line up."""

    node: str
    matched: int = 0
    missing: list[str] = field(default_factory=list)      # slots no tensor fills
    unexpected: list[str] = field(default_factory=list)   # published name -> mapped name with no slot
    misshaped: list[str] = field(default_factory=list)
    nbytes: int = 0                                       # bytes of the tensors this node reads
    loads: list[tuple[str, TensorInfo, list[Target]]] = field(default_factory=list)
    read: set[str] = field(default_factory=set)           # published names this node consumes (or skips as optional)
    published: set[str] = field(default_factory=set)      # every tensor name of the files the node's mapping reads
    excluded: set[str] = field(default_factory=set)       # published names the mapping leaves out on purpose
    config_notes: list[str] = field(default_factory=list)  # config values the library's default or derivation gave

    @property
    def is_ok(self) -> bool:
        return not (self.missing or self.unexpected or self.misshaped)

    def problems(self) -> str:
        """The first offending keys of each kind, one line each."""
        lines = []
        for title, keys in (("missing", self.missing), ("unexpected", self.unexpected),
                            ("wrong shape", self.misshaped)):
            if keys:
                more = f" ... (+{len(keys) - SHOWN_KEYS})" if len(keys) > SHOWN_KEYS else ""
                lines.append(f"  {title} ({len(keys)}): " + ", ".join(keys[:SHOWN_KEYS]) + more)
        return "\n".join(lines)


def match_node(node: str, cmap: CompiledMap, infos: Mapping[str, TensorInfo],
               slots: Mapping[str, Slot]) -> MatchReport:
    """Every published tensor the mapping selects against every slot, by name and shape."""
    report, filled = MatchReport(node, published=set(infos)), set()
    for name, info, targets in node_tensors(cmap, infos):
        report.read.add(name)
        if name.endswith(IGNORED_SUFFIXES) or all(cmap.is_optional(t.name) and t.name not in slots for t in targets):
            continue
        kept = []
        for target in targets:
            slot, shape = slots.get(target.name), cmap.target_shape(target, info.shape)
            if slot is None:
                renamed = f" (mapped to {target.name})" if target.name != name else ""
                report.unexpected.append(f"{name}{renamed}")
            elif not cmap.fits(target.name, shape, slot.shape):
                report.misshaped.append(f"{name} {shape} != expected {slot.shape} for {target.name}")
                filled.add(target.name)
            else:
                kept.append(target)
                filled.add(target.name)
                report.matched += 1
        if kept:
            report.loads.append((name, info, kept))
            report.nbytes += info.nbytes
    report.missing = sorted(set(slots) - filled)
    report.excluded = {name for name in infos if cmap.is_excluded(name)}
    return report


@torch.no_grad()
def load_matched(report: MatchReport, cmap: CompiledMap, slots: Mapping[str, Slot], source: str) -> None:
    """Copy every matched tensor into its slots, reading one file at a time; the report must be clean."""
    if not report.is_ok:
        raise WeightLoadError(report.missing, report.unexpected, report.misshaped)
    by_file: dict[Path, list[tuple[TensorInfo, list[Target]]]] = {}
    for _, info, targets in report.loads:
        by_file.setdefault(info.file, []).append((info, targets))
    for path, entries in by_file.items():
        with path.open("rb", buffering=0) as f:
            for info, targets in entries:
                tensor = read_tensor(f, info)
                for target in targets:
                    slot = slots[target.name]
                    slot.load(cmap.tensor(target, tensor, slot.shape))
    log.info("%s: loaded %d tensors (%.1f MiB) from %s", report.node, report.matched, report.nbytes / 2**20, source)
