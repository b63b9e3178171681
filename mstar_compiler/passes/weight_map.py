"""Pass 3, resolve (weights): a preset's `weights:` mapping for one node, checked into a `plan.WeightMap`.

The schema has checked the structure; here every regex must compile (its error points at the
rule), `index_remap` needs a group, a `split`'s chunks must be distinct, and `config` may only
name dims the node has, so a mapping that cannot work fails at compile time, not at load.
"""
from __future__ import annotations

import re
from typing import Any

from mstar_compiler import plan
from mstar_compiler.errors import Path, did_you_mean
from mstar_compiler.ir import IR, NodeIR


def resolve(ir: IR, node: NodeIR, raw: dict[str, Any], path: Path) -> plan.WeightMap:
    """The node's mapping from `raw` (schema-valid YAML), every rule checked."""
    for i, pattern in enumerate(raw.get("exclude", [])):
        _regex(ir, pattern, (*path, "exclude", i))
    for i, pattern in enumerate(raw.get("optional", [])):
        _regex(ir, pattern, (*path, "optional", i))
    for i, pattern in enumerate(raw.get("reshape", [])):
        _regex(ir, pattern, (*path, "reshape", i))
    for i, rule in enumerate(raw.get("rename", [])):
        _regex(ir, rule["match"], (*path, "rename", i, "match"))
    for i, rule in enumerate(raw.get("index_remap", [])):
        if _regex(ir, rule["match"], (*path, "index_remap", i, "match")).groups < 1:
            raise ir.doc.error("index_remap needs a group around the index", (*path, "index_remap", i, "match"),
                               r"e.g. '^decoder\.up\.(\d+)\.'")
    for i, rule in enumerate(raw.get("split", [])):
        _regex(ir, rule["match"], (*path, "split", i, "match"))
        if len(set(rule["into"])) != len(rule["into"]):
            raise ir.doc.error("split names repeat", (*path, "split", i, "into"), "give each chunk its own name")
    for key, dim in raw.get("config", {}).items():
        if dim not in node.dims:
            raise ir.doc.error(f"config key '{key}' is checked against unknown dim '{dim}' of node '{node.name}'",
                               (*path, "config", key), did_you_mean(dim, node.dims))
    return plan.WeightMap(
        source=raw["source"], files=list(raw.get("files", [])), prefix=raw.get("prefix", ""),
        exclude=list(raw.get("exclude", [])), optional=list(raw.get("optional", [])),
        index_remap=[plan.IndexRemap(r["match"], r["count"]) for r in raw.get("index_remap", [])],
        rename=[plan.Rename(r["match"], r["to"]) for r in raw.get("rename", [])],
        split=[plan.Split(r["match"], list(r["into"]), r.get("dim", 0)) for r in raw.get("split", [])],
        reshape=list(raw.get("reshape", [])), config=dict(raw.get("config", {})),
        config_file=raw.get("config_file", "config.json"))


def _regex(ir: IR, pattern: str, path: Path) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ir.doc.error(f"bad regular expression {pattern!r}: {exc}", path) from None
