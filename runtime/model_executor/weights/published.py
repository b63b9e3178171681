"""Loading a node from a published repository through the graph's mapping, checked first.

    report = check_published(node, root, slots)   # headers + the config file only: no tensor data
    load_published(module, node, root)            # the same check, then the copy

All raise for people: a config file (config.json, ...) that disagrees with the preset names both values
(ConfigMismatch), a mapping that does not cover the module names the first offending keys
and the fix (WeightMismatch). A config value the file lacks and the mapping's library supplies (its
class default, or what it derives from other keys) is said: check-weights prints it, the server logs it.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

from torch import nn

from mstar_compiler.plan import Node
from runtime.model_executor.weights.mapping import CompiledMap, config_mismatches
from runtime.model_executor.weights.match import MatchReport, load_matched, match_node
from runtime.model_executor.weights.repository import read_config, repository_files, tensor_infos
from runtime.model_executor.weights.slots import Slot, module_slots

log = logging.getLogger(__name__)


class ConfigMismatch(ValueError):
    """The repository's config file disagrees with the preset on a shape-deciding value."""


class WeightMismatch(ValueError):
    """The published tensors and the node's slots do not line up."""

    def __init__(self, node: Node, root: Path, report: MatchReport) -> None:
        super().__init__(f"node '{node.name}' ({node.kind}): {root} does not match the graph's weight mapping\n"
                         f"{report.problems()}\n  fix: {mismatch_fix(node, report)}")
        self.report = report


def mismatch_fix(node: Node, report: MatchReport) -> str:
    """What to change, for the first kind of problem the report shows."""
    assert node.weight_map is not None
    rule = f"the preset's `weights: {node.name}:` in {node.source.split(':')[0]}"
    files = ", ".join(node.weight_map.files) or "the index's shards / every .safetensors"
    if report.misshaped:
        return (f"the preset's dims disagree with the checkpoint (compare its {node.weight_map.config_file}), or "
                f"the mapping lacks a `reshape:`/`split:` rule ({rule})")
    if report.unexpected:
        return f"another repository or revision? else add an `exclude:` or `rename:` rule to {rule}"
    return f"incomplete download? the files read ({files}) lack these tensors; or a `rename:` rule in {rule} is wrong"


def check_config(node: Node, root: Path) -> list[str]:
    """Raise ConfigMismatch when the repository's config (the mapping's `config_file`) disagrees with the
    node's dims on a value the mapping's `config:` names; else the values taken as the mapping's library
    takes them because the file lacks the key (said to the user: a checkpoint read by a default)."""
    assert node.weight_map is not None
    if not node.weight_map.config:
        return []
    name = node.weight_map.config_file
    problems, notes = config_mismatches(node, read_config(root, name))
    if problems:
        raise ConfigMismatch(f"node '{node.name}' ({node.kind}): {root / name} disagrees with the graph:\n"
                             + "\n".join(f"  {p}" for p in problems)
                             + "\n  fix: compile the preset that matches this checkpoint, or download the "
                               f"repository the graph names ({node.weight_map.source})")
    return notes


def check_published(node: Node, root: Path, slots: Mapping[str, Slot]) -> MatchReport:
    """The node's key-by-key report against the repository at `root` (config checked first)."""
    assert node.weight_map is not None
    notes = check_config(node, root)
    infos = tensor_infos(repository_files(root, node.weight_map.files))
    report = match_node(node.name, CompiledMap(node.weight_map), infos, slots)
    report.config_notes = notes
    return report


def load_published(module: nn.Module, node: Node, root: Path) -> MatchReport:
    """Fill `module` from the repository at `root`; raises before copying anything when it does not match."""
    assert node.weight_map is not None
    slots = module_slots(module)
    report = check_published(node, root, slots)
    if not report.is_ok:
        raise WeightMismatch(node, root, report)
    load_matched(report, CompiledMap(node.weight_map), slots, str(root))
    return report
