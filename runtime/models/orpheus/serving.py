"""What Orpheus adds to the server: its speech prompt and voices (runtime/entrypoints/http/families.py).

The prompt is Orpheus' own `<start_of_human> "{voice}: {text}" <eot> <end_of_human>
<start_of_ai> <start_of_speech>`; the LM's executor stops at end_of_speech itself, so the
request carries no stop ids.
"""
from __future__ import annotations

from typing import Any

from runtime.entrypoints.http.audio_io import voice_for
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import FamilyServing, ServedModel

START_HUMAN, PROMPT_END = 128259, (128009, 128260, 128261, 128257)
VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
_OPENAI_VOICES = {"alloy": "tara", "ash": "leo", "ballad": "dan", "coral": "jess", "echo": "leo",
                  "fable": "dan", "onyx": "zac", "nova": "mia", "sage": "leah", "shimmer": "zoe", "verse": "zac"}


def orpheus_prompt(tokenizer: Any, voice: str, text: str) -> list[int]:
    """Orpheus' prompt ids for `text` in `voice`."""
    return [START_HUMAN, *tokenizer.encode(f"{voice}: {text}"), *PROMPT_END]


class OrpheusSpeaker:
    vocoder_kind = "snac_decoder"
    voices = VOICES
    can_chat = False

    def voice(self, name: str) -> str | None:
        return voice_for(name, VOICES, _OPENAI_VOICES)

    def prompt(self, server: ServedModel, voice: str, text: str) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        return orpheus_prompt(server.tokenizer, voice, text), {}, frozenset()

    def chat_prompt(self, server: ServedModel, voice: str, messages: list[dict[str, str]]):
        raise ApiError(400, f"the model '{server.model_id}' does not answer with audio in chat", "modalities")


SERVING = FamilyServing(frozenset({"snac_decoder"}), speaker=OrpheusSpeaker())
