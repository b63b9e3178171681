"""The graph's weight mapping (`plan.WeightMap`) applied to checkpoint names, shapes and tensors.

A published tensor name goes through, in order: the prefix (names without it belong to other
nodes), `exclude`, `index_remap`, `rename`, `split`; what comes out names module slots
(`runtime.model_executor.weights.slots`). `reshape` rules let a slot take a tensor of another shape with the same
element count (FLUX's 1x1-convolution attention projections as linears). Nothing here knows a model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import torch

from mstar_compiler.config_expr import MISSING, ExprError, names, read_value
from mstar_compiler.plan import Node, WeightMap
from runtime.model_executor.weights.headers import TensorInfo


@dataclass(frozen=True)
class Target:
    """One module slot a published tensor (or a chunk of it) fills."""

    name: str                   # slot name
    chunk: int = 0              # which equal chunk along `dim` (split rules), of `chunks`
    chunks: int = 1
    dim: int = 0


class CompiledMap:
    """A WeightMap with its regexes compiled."""

    def __init__(self, spec: WeightMap) -> None:
        self.spec = spec
        self.exclude = [re.compile(p) for p in spec.exclude]
        self.optional = [re.compile(p) for p in spec.optional]
        self.remap = [(re.compile(r.match), r.count) for r in spec.index_remap]
        self.rename = [(re.compile(r.match), r.to) for r in spec.rename]
        self.split = [(re.compile(s.match), s.into, s.dim) for s in spec.split]
        self.reshape = [re.compile(p) for p in spec.reshape]

    def targets(self, name: str) -> list[Target] | None:
        """The slots a published tensor fills; None when the tensor is not this node's."""
        if not name.startswith(self.spec.prefix):
            return None
        name = name[len(self.spec.prefix):]
        if any(p.search(name) for p in self.exclude):
            return None
        for pattern, count in self.remap:
            match = pattern.search(name)
            if match:
                name = f"{name[:match.start(1)]}{count - 1 - int(match.group(1))}{name[match.end(1):]}"
        for pattern, to in self.rename:
            name = pattern.sub(to, name)
        for pattern, into, dim in self.split:
            match = pattern.fullmatch(name)
            if match:
                return [Target(match.expand(part), i, len(into), dim) for i, part in enumerate(into)]
        return [Target(name)]

    def is_excluded(self, name: str) -> bool:
        """Whether the mapping deliberately leaves a published tensor unread (its `exclude:`)."""
        if not name.startswith(self.spec.prefix):
            return False
        return any(p.search(name[len(self.spec.prefix):]) for p in self.exclude)

    def is_optional(self, name: str) -> bool:
        return any(p.fullmatch(name) for p in self.optional)

    def can_reshape(self, name: str) -> bool:
        return any(p.fullmatch(name) for p in self.reshape)

    def target_shape(self, target: Target, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of `target`'s part of a published tensor of `shape`."""
        if target.chunks == 1:
            return shape
        out = list(shape)
        out[target.dim] //= target.chunks
        return tuple(out)

    def fits(self, name: str, shape: tuple[int, ...], slot_shape: tuple[int, ...]) -> bool:
        """Whether a part of `shape` fills slot `name` of `slot_shape` (directly or by a reshape rule)."""
        if shape == slot_shape:
            return True
        return self.can_reshape(name) and _numel(shape) == _numel(slot_shape)

    def tensor(self, target: Target, tensor: torch.Tensor, slot_shape: tuple[int, ...]) -> torch.Tensor:
        """`target`'s part of a published tensor, shaped as its slot."""
        if target.chunks > 1:
            tensor = tensor.chunk(target.chunks, target.dim)[target.chunk]
        return tensor if tuple(tensor.shape) == slot_shape else tensor.reshape(slot_shape)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def node_tensors(cmap: CompiledMap, infos: Mapping[str, TensorInfo]) -> Iterator[tuple[str, TensorInfo, list[Target]]]:
    """(published name, info, slots it fills) for every published tensor this node reads."""
    for name, info in infos.items():
        targets = cmap.targets(name)
        if targets is not None:
            yield name, info, targets


def config_mismatches(node: Node, config: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(each disagreement between the repository's config file and the node's preset dims, each value
    taken as the mapping's `config_library` takes it because the file lacks the key)."""
    wm = node.weight_map
    assert wm is not None
    problems, notes, file = [], [], wm.config_file
    for key, dim in wm.config.items():
        default = wm.config_defaults.get(key, MISSING)
        try:
            found = read_value(config, key, default, wm.config_derive.get(key))
        except ExprError as exc:
            problems.append(f"{file} `{key}`: {wm.config_library} derives it as {wm.config_derive[key]}, which "
                            f"does not compute here: {exc}")
            continue
        if found is None:
            problems.append(f"{file} has no `{key}` (the graph checks it against dim {dim}){_needs(wm, key)}")
            continue
        taken = "" if found.source == "file" else f" ({_how(wm, key, file, found.source)})"
        if found.source != "file":
            notes.append(f"{file} `{key}` = {found.value!r}{taken}")
        if _as_json(found.value) != _as_json(node.dims.get(dim)):
            problems.append(f"{file} `{key}` = {found.value!r}{taken} but preset '{node.preset}' of node "
                            f"'{node.name}' has {dim} = {node.dims.get(dim)!r}")
    return problems, notes


def _how(wm: WeightMap, key: str, file: str, source: str) -> str:
    if source == "default":
        return f"absent from {file}: the default of {wm.config_library}"
    return f"null or absent in {file}: {wm.config_library} derives it as {wm.config_derive[key]}"


def _needs(wm: WeightMap, key: str) -> str:
    """Why no value could be taken: the derivation's inputs are missing too, or none is declared."""
    if key in wm.config_derive:
        return f", nor what {wm.config_library} derives it from ({', '.join(names(wm.config_derive[key]))})"
    return ""


def _as_json(value: Any) -> Any:
    """A dim as JSON reads it: a preset's tuples (decoder_rates) compare equal to the config's lists."""
    return [_as_json(v) for v in value] if isinstance(value, (list, tuple)) else value
