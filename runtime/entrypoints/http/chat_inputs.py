"""Model-specific chat inputs: the hook through which a family reads non-text content parts.

A family whose chat takes audio or images gives its `FamilyServing` (runtime/entrypoints/http/families.py)
a `chat_inputs(plan)` factory; it returns a processor for the plan, or None when the plan is
not one it serves. The generic handlers only call the processor; they never look at a kind
or a family.
"""
from __future__ import annotations

from typing import Any, Protocol

from mstar_compiler.plan import Plan
from runtime.entrypoints.http.families import families_of


class ChatInputs(Protocol):
    """Turns chat messages with content parts into the conductor's input items."""

    sample_rate: int     # the rate of the waveforms in its audio items (the audio encoder's)

    def chat_items(self, messages: list[dict], tokenizer: Any) -> list[tuple[str, Any]] | None:
        """The prompt's input items in message order (text ids and media items), None when every
        part is text (the handler's text path applies); raises ApiError (4xx) for a bad part."""

    def request_params(self, items: list[tuple[str, Any]]) -> dict[str, Any]:
        """Scalar request params the model's executors read about these items (e.g. the grids of
        pictures' positions); {} when none."""

    def transcription_messages(self, audio_part: dict, language: str | None, prompt: str | None) -> list[dict]:
        """The chat messages that ask the model to transcribe `audio_part` (an `input_audio` part)."""


def chat_inputs_for(plan: Plan) -> ChatInputs | None:
    """The plan's processor of non-text chat inputs (its family's `FamilyServing.chat_inputs`), None
    when no family of it has one."""
    for family in families_of(plan):
        if family.chat_inputs is not None and (inputs := family.chat_inputs(plan)) is not None:
            return inputs
    return None
