"""Pass 1, load: YAML text to plain data plus the file:line:column of every key and value.

Values are plain Python (dict/list/str/int/float/bool/None) so the JSON Schema validator
can read them; positions live beside them in `Doc.value_pos` / `Doc.key_pos`, keyed by
the YAML path (a tuple of keys and list indices).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import yaml

from mstar_compiler.errors import CompileError, Path, Position

MAX_DEPTH = 64
# a path's head (INCLUDED, <include>, ...) points into an included graph file (pass resolve's include.py)
INCLUDED = "<included>"


@dataclass
class Doc:
    """A loaded graph file."""

    file: str                                   # file name as given (for messages)
    text: str                                   # the YAML text
    data: Any                                   # plain data
    value_pos: dict[Path, Position] = field(default_factory=dict)
    key_pos: dict[Path, Position] = field(default_factory=dict)

    def where(self, path: Path, *, key: bool = False) -> Position:
        """Position of the value (or its key) at `path`; falls back to the nearest parent."""
        table = self.key_pos if key else self.value_pos
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if p in self.value_pos:
                return self.value_pos[p]
            p = p[:-1]
        return self.value_pos.get((), Position(self.file, 1, 1))

    def error(self, message: str, path: Path, hint: str = "", *, key: bool = False) -> CompileError:
        shown = tuple(path)
        while len(shown) > 2 and shown[0] == INCLUDED:      # the path in the file the position names
            shown = shown[2:]
        return CompileError(message, self.where(path, key=key), shown, hint)

    def get(self, path: Path, default: Any = None) -> Any:
        value = self.data
        for part in path:
            try:
                value = value[part]
            except (KeyError, IndexError, TypeError):
                return default
        return value


def _pos(file: str, mark: yaml.Mark) -> Position:
    return Position(file, mark.line + 1, mark.column + 1)


class _Builder:
    def __init__(self, file: str, loader: yaml.SafeLoader) -> None:
        self.file = file
        self.loader = loader
        self.value_pos: dict[Path, Position] = {}
        self.key_pos: dict[Path, Position] = {}

    def build(self, node: yaml.Node, path: Path) -> Any:
        if len(path) > MAX_DEPTH:
            raise CompileError("the document nests too deeply (recursive alias?)",
                               _pos(self.file, node.start_mark), path)
        self.value_pos[path] = _pos(self.file, node.start_mark)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._scalar(node, path)

    def _mapping(self, node: yaml.MappingNode, path: Path) -> dict[str, Any]:
        self.loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._scalar(key_node, path) if isinstance(key_node, yaml.ScalarNode) else None
            where = _pos(self.file, key_node.start_mark)
            if not isinstance(key, str):
                raise CompileError(f"mapping keys must be strings, not {key_node.value!r}",
                                   where, path, "quote the key: \"...\"")
            if key in out:
                raise CompileError(f"duplicate key '{key}'", where, (*path, key),
                                   "each key may appear once in a mapping")
            self.key_pos[(*path, key)] = where
            out[key] = self.build(value_node, (*path, key))
        return out

    def _scalar(self, node: yaml.Node, path: Path) -> Any:
        value = self.loader.construct_object(node, deep=True)
        if isinstance(value, (datetime.date, datetime.datetime)):
            return node.value
        if isinstance(value, bytes):
            return node.value
        if isinstance(value, float) and value != value:
            return node.value
        return value


def load_text(text: str, file: str) -> Doc:
    """Parse YAML `text` (from `file`) into a Doc; YAML syntax errors become CompileError."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise CompileError(f"YAML: {exc}".splitlines()[0], Position(file, 1, 1), (),
                           "the file holds characters YAML does not allow") from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise CompileError("the graph file is empty", Position(file, 1, 1), (),
                               "start with `mstar: 1` and `model: NAME`")
        builder = _Builder(file, loader)
        data = builder.build(root, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = _pos(file, mark) if mark else Position(file, 1, 1)
        raise CompileError(f"YAML syntax: {exc.problem or exc.context}", where, (),
                           "check indentation, quotes and colons here") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise CompileError(f"YAML: {exc}".splitlines()[0], Position(file, 1, 1)) from None
    finally:
        loader.dispose()
    return Doc(file, text, data, builder.value_pos, builder.key_pos)


def load_file(path: str) -> Doc:
    """Read and load a graph file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CompileError(f"cannot read graph file: {exc}", Position(path, 1, 1)) from None
    return load_text(text, path)
