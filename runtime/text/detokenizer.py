"""Incremental detokenisation: one token id in, the new text out, never half a character.

Byte-level BPE tokens are bytes, not characters: an emoji or a CJK character is often
spread over two or three tokens, and decoding each token alone yields U+FFFD garbage
(the M* reference implementation's streaming bug). `IncrementalDetokenizer` decodes a
short window of recent tokens instead and releases text only once the window no longer
ends in an incomplete character; the window also gives tokenizers whose decoding of a
token depends on its neighbours (SentencePiece's leading space) their context.

Invariant: the concatenation of every `push` result and the final `flush` equals
`tokenizer.decode(all pushed ids)`, and no `push` result contains U+FFFD unless the
full decode has one there.

Handlers do not use it directly: `TextOutput` (runtime/text/output.py) wraps it with the
request's stop rules and is the one entry point for output text.
"""
from __future__ import annotations

from typing import Sequence

from runtime.text.tokenizer import TextTokenizer

_REPLACEMENT = "\ufffd"
PROMPT_CONTEXT_TOKENS = 6     # prompt tail decoded ahead of the first output token, for context


class IncrementalDetokenizer:
    """Per-request incremental decoder; `push` each generated token, `flush` at the end."""

    def __init__(self, tokenizer: TextTokenizer, prompt_ids: Sequence[int] = (), *,
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_ids)[-PROMPT_CONTEXT_TOKENS:]
        self._prefix = 0                 # window start: text before it has been released
        self._read = len(self._ids)      # ids before this index have been released as text

    def push(self, token_id: int) -> str:
        """Text that token `token_id` completes; "" while a character is still incomplete."""
        self._ids.append(int(token_id))
        released, text = self._window_texts()
        if len(text) <= len(released) or text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(released):]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end, as U+FFFD)."""
        released, text = self._window_texts()
        self._prefix = self._read = len(self._ids)
        return text[len(released):]

    def _window_texts(self) -> tuple[str, str]:
        """(text of the window's already-released tokens, text of the whole window)."""
        window = self._ids[self._prefix:]
        released = self._decode(window[:self._read - self._prefix])
        return released, self._decode(window)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
