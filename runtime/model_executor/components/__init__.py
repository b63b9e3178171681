"""Component registry: `kind` string -> implementation class.

The `kind` string is the one in YAML, in the catalogue (`mstar_compiler.catalogue`) and
the name of the module that implements it, `runtime/models/<family>/<kind>.py` (the family
is the catalogue module that defines the kind). Built-in kinds register with
`@register("kind")` when their module is imported; a separately
installed package adds kinds through the entry-point group ``mstar.components``, each
entry point loading to a class with a `kind` attribute.

Contract of an implementation class (checked by tests/runtime/test_registry_matches_catalogue.py):
  * `cls.kind: str` — its catalogue kind;
  * `cls(dims: Mapping[str, Any], args: Mapping[str, Any])` builds a `torch.nn.Module`
    for a preset's dims with seeded-random-initialisable parameters whose names follow
    the published checkpoint (HF layout), and whose total `numel()` equals the
    catalogue's `num_params(dims)`.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Callable, TypeVar

from mstar_compiler.catalogue import load_catalogue

T = TypeVar("T", bound=type)

_REGISTRY: dict[str, type] = {}


def register(kind: str) -> Callable[[T], T]:
    """Class decorator: make `cls` the implementation of `kind`."""

    def deco(cls: T) -> T:
        if kind in _REGISTRY and _REGISTRY[kind] is not cls:
            raise ValueError(f"component kind {kind!r} is registered twice")
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return deco


def _import_builtin(kind: str) -> None:
    """Import runtime/models/<family>/<kind>.py for a built-in kind (plugin kinds have none)."""
    catalogue = load_catalogue()
    if kind in catalogue and catalogue[kind].family:
        importlib.import_module(f"runtime.models.{catalogue[kind].family}.{kind}")


def _load_plugins() -> None:
    for ep in entry_points(group="mstar.components"):
        cls = ep.load()
        register(cls.kind)(cls)


def component_class(kind: str) -> type:
    """The implementation class of `kind` (imports its module on first use)."""
    if kind not in _REGISTRY:
        _import_builtin(kind)
    if kind not in _REGISTRY:
        _load_plugins()
    if kind not in _REGISTRY:
        raise KeyError(f"no runtime implementation for component kind {kind!r}")
    return _REGISTRY[kind]


def registered_kinds() -> list[str]:
    """Every kind of the catalogue that has an implementation (imports them all)."""
    _load_plugins()
    for kind in load_catalogue().kinds():
        _import_builtin(kind)
    return sorted(_REGISTRY)
