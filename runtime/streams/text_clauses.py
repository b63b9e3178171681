"""Text written piece by piece, released a clause at a time: the runtime side of a `delimited` policy.

A clause ends right after a delimiter once it holds at least `min_size` characters (leading and trailing
whitespace not counted). A delimiter made of ASCII punctuation counts only when whitespace follows it, so
"3.14", "e.g." inside a word or "..." still being written are not cut; any other delimiter ("。", "\\n")
counts at once. Text that reaches `max_size` characters with no such delimiter is cut at its last
whitespace before that (at `max_size` itself when it has none). `finish()` releases the rest.

Every character appended is released exactly once and in order: the clauses joined are the text
written, whitespace included, except whitespace that would make a clause of its own (a blank rest, a
run of spaces longer than `max_size`), which is dropped, never spoken; no clause is blank or longer than
`max_size`. tests/runtime/streams/test_text_clauses.py checks this with hypothesis.
"""
from __future__ import annotations

import string

from mstar_compiler.plan import ChunkPolicy

_ASCII_PUNCT = frozenset(string.punctuation)


class TextClauses:
    """The pending text of one stream and the clauses its policy releases."""

    def __init__(self, delimiters: list[str], min_size: int, max_size: int) -> None:
        if not delimiters or not 1 <= min_size <= max_size:
            raise ValueError(f"a delimited policy needs delimiters and 1 <= min <= max, got {delimiters!r}, "
                             f"{min_size}, {max_size}")
        self.delimiters = sorted(delimiters, key=len, reverse=True)   # the longest match at a position
        self.min_size, self.max_size = min_size, max_size
        self.pending = ""

    @classmethod
    def of(cls, policy: ChunkPolicy) -> "TextClauses":
        """The cutter of a plan's `delimited` policy."""
        if policy.kind != "delimited":
            raise ValueError(f"a text stream is cut by a delimited policy, not {policy.kind}")
        return cls(policy.delimiters, policy.min_size, policy.size)

    def append(self, text: str) -> list[str]:
        """Add `text`; the clauses it completes, in order."""
        self.pending += text
        out = []
        while (cut := self._cut()) is not None:
            head, self.pending = self.pending[:cut], self.pending[cut:]
            if head.strip():          # a run of whitespace longer than max_size is never spoken
                out.append(head)
        return out

    def finish(self) -> list[str]:
        """The rest as the last clause (none when it is only whitespace); the cutter is empty after."""
        rest, self.pending = self.pending, ""
        out = []
        while len(rest) > self.max_size:       # only when finish follows an append with no cut left
            cut = _space_cut(rest, self.max_size)
            if rest[:cut].strip():
                out.append(rest[:cut])
            rest = rest[cut:]
        return out + [rest] if rest.strip() else out

    def _cut(self) -> int | None:
        """Where the first clause of the pending text ends, None while it may still grow."""
        text = self.pending
        for end in range(1, min(len(text), self.max_size) + 1):
            if self._ends_clause(text, end) and len(text[:end].strip()) >= self.min_size:
                return end
        if len(text) > self.max_size:
            return _space_cut(text, self.max_size)
        return None

    def _ends_clause(self, text: str, end: int) -> bool:
        for d in self.delimiters:
            if text.endswith(d, 0, end):
                if all(c in _ASCII_PUNCT for c in d):
                    return end < len(text) and text[end].isspace()
                return True
        return False


def _space_cut(text: str, limit: int) -> int:
    """The end of the longest non-blank head of `text` that stops at whitespace within `limit` characters,
    `limit` when there is none."""
    for end in range(limit, 0, -1):
        if text[end].isspace() and text[:end].strip():
            return end
    return limit
