"""CompileError: every user mistake, with where (file:line:column, YAML path) and a hint."""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable

Path = tuple["str | int", ...]


@dataclass(frozen=True)
class Position:
    """A 1-based line and column in a graph file."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


def format_path(path: Path) -> str:
    """YAML path for people: `walks.draw[0].do`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<document>"


class CompileError(Exception):
    """A mistake in a graph file (or command line), reported to people, never a traceback."""

    def __init__(self, message: str, position: Position | None = None,
                 path: Path = (), hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        self.path = path
        self.hint = hint

    def __str__(self) -> str:
        where = f"{self.position}: " if self.position else ""
        text = f"{where}error: {self.message}"
        if self.path:
            text += f"\n  at {format_path(self.path)}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """A hint naming the closest choice, or listing the choices when none is close."""
    choices = sorted(set(choices))
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    if not choices:
        return ""
    shown = ", ".join(f"'{c}'" for c in choices[:12])
    return f"known: {shown}" + (", ..." if len(choices) > 12 else "")
