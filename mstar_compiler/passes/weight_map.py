"""Pass 3, resolve (weights): a preset's `weights:` mapping for one node, checked into a `plan.WeightMap`.

The schema has checked the structure; here every regex must compile (its error points at the
rule), `index_remap` needs a group, a `split`'s chunks must be distinct, `config` may only
name dims the node has, its `derive` expressions must parse and its defaults need a
`config_library`, so a mapping that cannot work fails at compile time, not at load.
"""
from __future__ import annotations

import re
from typing import Any

from mstar_compiler import config_expr, plan
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
    config, defaults, derive = _config(ir, node, raw, path)
    return plan.WeightMap(
        source=raw["source"], files=list(raw.get("files", [])), prefix=raw.get("prefix", ""),
        exclude=list(raw.get("exclude", [])), optional=list(raw.get("optional", [])),
        index_remap=[plan.IndexRemap(r["match"], r["count"]) for r in raw.get("index_remap", [])],
        rename=[plan.Rename(r["match"], r["to"]) for r in raw.get("rename", [])],
        split=[plan.Split(r["match"], list(r["into"]), r.get("dim", 0)) for r in raw.get("split", [])],
        reshape=list(raw.get("reshape", [])), config=config, config_file=raw.get("config_file", "config.json"),
        config_defaults=defaults, config_derive=derive, config_library=_library(raw.get("config_library")))


def _config(ir: IR, node: NodeIR, raw: dict[str, Any], path: Path
            ) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    """(key -> dim, key -> default, key -> derive expression) of the mapping's `config:`, each dim one the
    node has, each expression parsed, and a `config_library` wherever a default or derivation is given."""
    config, defaults, derive = {}, {}, {}
    for key, entry in raw.get("config", {}).items():
        where = (*path, "config", key)
        spec = {"dim": entry} if isinstance(entry, str) else entry
        config[key] = dim = spec["dim"]
        if dim not in node.dims:
            raise ir.doc.error(f"config key '{key}' is checked against unknown dim '{dim}' of node '{node.name}'",
                               (*where, "dim") if isinstance(entry, dict) else where, did_you_mean(dim, node.dims))
        if "default" in spec:
            defaults[key] = spec["default"]
        if "derive" in spec:
            try:
                config_expr.parse(spec["derive"])
            except config_expr.ExprError as exc:
                raise ir.doc.error(f"config key '{key}': bad derive expression {spec['derive']!r}: {exc}",
                                   (*where, "derive"), "e.g. derive: hidden_size // num_attention_heads") from None
            derive[key] = spec["derive"]
        if ("default" in spec or "derive" in spec) and "config_library" not in raw:
            raise ir.doc.error(f"config key '{key}' says what the library takes when the file lacks it, but the "
                               "mapping names no library", where,
                               "add config_library: {name: transformers, version: 5.25.0, class: LlamaConfig}")
    return config, defaults, derive


def _library(raw: dict[str, str] | None) -> str:
    return f"{raw['name']} {raw['version']} {raw['class']}" if raw else ""


def _regex(ir: IR, pattern: str, path: Path) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ir.doc.error(f"bad regular expression {pattern!r}: {exc}", path) from None
