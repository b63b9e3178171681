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
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from mstar_compiler.catalogue import BUILTIN_FAMILIES
from mstar_compiler.plan import Plan

if TYPE_CHECKING:
    import torch
    from aiohttp import web

    from runtime.text.tokenizer import TextTokenizer


class ServedModel(Protocol):
    """What a family's prompts may read of the server (runtime/entrypoints/http/context.py's ServerContext has more)."""

    plan: Plan
    model_id: str                     # the name clients send as `model`
    tokenizer: TextTokenizer          # the chat LM's

    def stop_token_ids(self, extra: Sequence[int] = (), ignore_eos: bool = False) -> frozenset[int]:
        """The ids a request stops at: end of sequence and `extra`; none with `ignore_eos`."""


class Speaker(Protocol):
    """How a family's speaking graph is asked to speak (the generic speech endpoints call it)."""

    vocoder_kind: str                 # the node kind whose audio output the client hears
    voices: tuple[str, ...]           # the model's own voice names
    can_chat: bool                    # answers /v1/chat/completions with `modalities: [..., "audio"]`

    def voice(self, name: str) -> str | None:
        """The model's voice for a requested name (its own or one of OpenAI's), None if unknown."""

    def prompt(self, server: ServedModel, voice: str, text: str) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        """(prompt ids, values for the family's executors (`RequestParams.family`), stop ids) to speak
        `text` in `voice`."""

    def chat_prompt(self, server: ServedModel, voice: str,
                    messages: list[dict[str, str]]) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        """The same for a chat answered in speech (only where `can_chat`)."""


class Listener(Protocol):
    """A family's way of hearing a /v1/realtime session (runtime/entrypoints/http/realtime_session.py)."""

    listen_task: str            # the plan task that encodes an utterance while it streams in
    stream_name: str            # its client-fed stream
    rows_key: str               # "<node>.<port>" of the rows its walk emits
    max_seconds: float          # the longest utterance (the graph's audio limit)

    def stream(self) -> Any:
        """A new audio buffer: `push(pcm16 bytes)` / `finish()` return new features; `seconds`."""

    def stream_items(self, features: Any) -> list[dict[str, torch.Tensor]]: ...

    def answer_items(self, tokenizer: Any, rows: torch.Tensor,
                     instructions: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]: ...


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
    # the reader of non-text chat parts (runtime/entrypoints/http/chat_inputs.py's ChatInputs) for a plan
    chat_inputs: Callable[[Plan], Any] | None = None
    # how a /v1/realtime session's audio is heard (None: not for this plan)
    realtime: Callable[[Plan], Listener | None] | None = None


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
