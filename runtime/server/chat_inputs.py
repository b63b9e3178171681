"""Model-specific chat inputs: the hook through which a family reads non-text content parts.

A family whose chat takes audio or images registers a factory with `register_chat_inputs`
in `runtime/models/<family>/chat_inputs.py`; that module is imported, for each family of
the plan's nodes that has one, the first time a server asks for the plan's `ChatInputs`.
The factory returns a processor for the plan, or None when the plan is not one it serves.
The generic handlers only call the processor; they never look at a kind or a family.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, Protocol

from mstar_compiler.catalogue import load_catalogue
from mstar_compiler.plan import Plan


class ChatInputs(Protocol):
    """Turns chat messages with content parts into the conductor's input items."""

    sample_rate: int     # the rate of the waveforms in its audio items (the audio encoder's)

    def chat_items(self, messages: list[dict], tokenizer: Any) -> list[tuple[str, Any]] | None:
        """The prompt's input items in message order (text ids and media items), None when every
        part is text (the handler's text path applies); raises ApiError (4xx) for a bad part."""

    def transcription_messages(self, audio_part: dict, language: str | None, prompt: str | None) -> list[dict]:
        """The chat messages that ask the model to transcribe `audio_part` (an `input_audio` part)."""


_FACTORIES: list[Callable[[Plan], ChatInputs | None]] = []


def register_chat_inputs(factory: Callable[[Plan], ChatInputs | None]) -> Callable[[Plan], ChatInputs | None]:
    """Decorator: `factory(plan)` is asked for every plan whose nodes include the family."""
    _FACTORIES.append(factory)
    return factory


def chat_inputs_for(plan: Plan) -> ChatInputs | None:
    """The plan's processor of non-text chat inputs, None when no family of it has one."""
    catalogue = load_catalogue()
    families = {catalogue[n.kind].family for n in plan.nodes if n.kind in catalogue and catalogue[n.kind].family}
    for family in sorted(families):
        module = f"runtime.models.{family}.chat_inputs"
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    return next((p for p in (f(plan) for f in _FACTORIES) if p is not None), None)
