"""Component classes: `kind` string -> the class that implements it.

The `kind` string is the one in YAML and in the catalogue (`mstar_compiler.catalogue`), and the
name of the module that implements a built-in kind, `runtime/models/<family>/<kind>.py`. Which
class implements a kind is declared once, by the kind's `Family` (`Family.components`, a
"module:Class" reference: built-in families in mstar_compiler/catalogue/<family>.py, plugins through
the entry-point group ``mstar.families``); `component_class` imports it on first use.

Contract of an implementation class (checked by tests/runtime/models/test_registry_matches_catalogue.py):
  * `cls.kind: str` — its catalogue kind (a class attribute);
  * `cls(dims: Mapping[str, Any], args: Mapping[str, Any])` builds a `torch.nn.Module`
    for a preset's dims with seeded-random-initialisable parameters whose names follow
    the published checkpoint (HF layout), and whose total `numel()` equals the
    catalogue's `num_params(dims)`.
"""
from __future__ import annotations

from mstar_compiler.catalogue import FAMILIES_GROUP, load_catalogue, load_families, load_ref

_CLASSES: dict[str, type] = {}      # kind -> its class, once imported


def _load(kind: str) -> type:
    catalogue = load_catalogue()
    if kind not in catalogue:
        raise KeyError(f"no runtime implementation for component kind {kind!r}: no built-in family or installed "
                       f"plugin (entry-point group {FAMILIES_GROUP}) declares it; known: {', '.join(catalogue.kinds())}")
    family = load_families()[catalogue[kind].family]
    cls = load_ref(family.components[kind])
    if getattr(cls, "kind", None) != kind:
        raise TypeError(f"family {family.name!r} implements kind {kind!r} with {family.components[kind]}, whose "
                        f"`kind` is {getattr(cls, 'kind', None)!r}: a component class names its kind (`kind = {kind!r}`)")
    return cls


def component_class(kind: str) -> type:
    """The implementation class of `kind` (imports its module on first use)."""
    if kind not in _CLASSES:
        _CLASSES[kind] = _load(kind)
    return _CLASSES[kind]


def registered_kinds() -> list[str]:
    """Every kind of the catalogue whose implementation class imports (imports them all)."""
    kinds = load_catalogue().kinds()
    for kind in kinds:
        component_class(kind)
    return kinds
