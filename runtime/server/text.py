"""Text in and out for the served LM: its tokenizer (or a byte tokenizer) and incremental decoding.

Decoding streams text without breaking multi-byte characters: each step decodes a short
window of ids and holds back output that ends in an incomplete character (U+FFFD).
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Protocol, Sequence

log = logging.getLogger(__name__)


class Tokenizer(Protocol):
    eos_token_ids: frozenset[int]

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255: for LMs with seeded random weights and no vocabulary."""

    eos_token_ids: frozenset[int] = frozenset()

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
        return "\n".join(lines) + ("\nassistant: " if add_generation_prompt else "")


def load_text_tokenizer(weight_ref: str | None) -> Any:
    """The tokenizer of the LM's checkpoint, or a byte tokenizer for seeded random weights."""
    if not weight_ref:
        return ByteTokenizer()
    from runtime.text.tokenizer import load_tokenizer
    return load_tokenizer(weight_ref)


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas (vLLM's prefix/read offsets)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0     # ids before this are settled text
        self._read = 0       # ids before this have been emitted

    def push(self, new_ids: Sequence[int]) -> str:
        self.ids.extend(new_ids)
        prefix_text = self.tokenizer.decode(self.ids[self._prefix:self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix:])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            delta = full_text[len(prefix_text):]
            self._prefix, self._read = self._read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is held back at the end (an incomplete character is emitted as U+FFFD)."""
        prefix_text = self.tokenizer.decode(self.ids[self._prefix:self._read])
        full_text = self.tokenizer.decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return full_text[len(prefix_text):]
