"""What a model family adds to the HTTP server, registered by `runtime/models/<family>/serving.py`.

The generic server names no family and no kind. A family whose models need more than the
generic handlers (its own endpoints, how it is prompted to speak, its voices, what the
page's playground offers) registers a `FamilyServing` when its serving module is imported;
`families_of(plan)` returns those whose kinds the plan holds (built-in families' serving
modules are imported on first use, plugins come through the entry-point group
``mstar.serving``, each loading to a `FamilyServing`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable, Protocol

from mstar_compiler.catalogue import BUILTIN_FAMILIES
from mstar_compiler.plan import Plan

if TYPE_CHECKING:
    from aiohttp import web

    from runtime.server.app import MstarServer


class Speaker(Protocol):
    """How a family's speaking graph is asked to speak (the generic speech endpoints call it)."""

    vocoder_kind: str                 # the node kind whose audio output the client hears
    voices: tuple[str, ...]           # the model's own voice names
    can_chat: bool                    # answers /v1/chat/completions with `modalities: [..., "audio"]`

    def voice(self, name: str) -> str | None:
        """The model's voice for a requested name (its own or one of OpenAI's), None if unknown."""

    def prompt(self, server: MstarServer, voice: str, text: str) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        """(prompt ids, values for the family's executors (`RequestParams.family`), stop ids) to speak
        `text` in `voice`."""

    def chat_prompt(self, server: MstarServer, voice: str,
                    messages: list[dict[str, str]]) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        """The same for a chat answered in speech (only where `can_chat`)."""


@dataclass(frozen=True)
class FamilyServing:
    """One family's additions to the server."""

    family: str
    kinds: frozenset[str]                                   # a plan with any of these is served by it
    speaker: Speaker | None = None
    install: Callable[[web.Application], None] | None = None    # adds the family's own routes
    playground: Callable[[Plan], dict[str, Any]] | None = None  # the page's panels it can fill
    # an input image (PIL) as the family's models take it (BAGEL resizes every input image)
    prepare_image: Callable[[Plan, Any], Any] | None = None
    # the reader of non-text chat parts (runtime/server/chat_inputs.py's ChatInputs) for a plan
    chat_inputs: Callable[[Plan], Any] | None = None
    # how a /v1/realtime session's audio is heard (runtime/server/realtime_session.py's Listener)
    realtime: Callable[[Plan], Any] | None = None


_FAMILIES: dict[str, FamilyServing] = {}
_loaded = False


def register_family_serving(serving: FamilyServing) -> FamilyServing:
    if serving.family in _FAMILIES and _FAMILIES[serving.family] != serving:
        raise ValueError(f"family {serving.family!r} registers its serving twice")
    _FAMILIES[serving.family] = serving
    return serving


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for family in BUILTIN_FAMILIES:
        try:
            importlib.import_module(f"runtime.models.{family}.serving")
        except ModuleNotFoundError as exc:
            if exc.name != f"runtime.models.{family}.serving":
                raise
    for ep in entry_points(group="mstar.serving"):
        register_family_serving(ep.load())
    _loaded = True


def families_of(plan: Plan) -> list[FamilyServing]:
    """The registered families whose kinds the plan holds, in registration order."""
    _load()
    kinds = {n.kind for n in plan.nodes}
    return [f for f in _FAMILIES.values() if f.kinds & kinds]
