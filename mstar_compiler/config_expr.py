"""The `derive:` expressions of a weight mapping's `config:` entries, and how a config value is read.

A published repository's config file is written by whatever release of the library that defines
its format the publisher had; an older one may lack a key a newer one writes, and the library then
takes its class default or computes the value from other keys (LlamaConfig: `num_key_value_heads`
absent or null is `num_attention_heads`). A mapping entry may say so:

    config:
      thinker_config.vision_config.num_position_embeddings: {dim: num_position_embeddings, default: 2304}
      num_key_value_heads: {dim: num_key_value_heads, derive: num_attention_heads}
    config_library: {name: transformers, version: 5.25.0, class: LlamaConfig}

A `derive` expression is integer arithmetic (`+ - * / // **`, parentheses) over integer literals and
the keys beside the entry's own (same section of the file). It is parsed here at compile time, so a
bad one fails with the graph's file:line, and evaluated at load time by `read_value`. No `eval`.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping

MAX_EXPONENT = 64     # a config file's values feed `**`: no exponent may make the reader compute for ever


def _power(base: Any, exponent: Any) -> Any:
    if not 0 <= exponent <= MAX_EXPONENT:
        raise ExprError(f"exponent {exponent} is outside 0..{MAX_EXPONENT}")
    return base ** exponent


_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Pow: _power}
MISSING: Any = object()   # read_value's `default` when the mapping declares none


class ExprError(ValueError):
    """A `derive:` expression outside the grammar."""


def parse(expr: str) -> ast.expr:
    """The expression's tree, every node inside the grammar (ExprError otherwise)."""
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError as exc:
        raise ExprError(f"not an expression: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _OPS:
                raise ExprError(f"operator {type(node.op).__name__} is not allowed (use + - * / // **)")
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise ExprError(f"only integer literals are allowed, not {node.value!r}")
        elif not isinstance(node, (ast.Name, ast.Load) + tuple(_OPS)):
            raise ExprError(f"{type(node).__name__} is not allowed: integer arithmetic over the keys beside "
                            "this one (+ - * / // ** and parentheses)")
    return tree


def names(expr: str) -> list[str]:
    """The keys `expr` reads, in order of first use."""
    return list(dict.fromkeys(n.id for n in ast.walk(parse(expr)) if isinstance(n, ast.Name)))


def evaluate(expr: str, section: Mapping[str, Any]) -> Any:
    """`expr` over the keys of `section`; KeyError naming a key the section lacks (or holds as null),
    ExprError when the values do not compute (a zero divisor, a string, an exponent out of range)."""
    def value(node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if section.get(node.id) is None:
                raise KeyError(node.id)
            return section[node.id]
        assert isinstance(node, ast.BinOp)
        return _OPS[type(node.op)](value(node.left), value(node.right))
    try:
        result = value(parse(expr))
    except (ZeroDivisionError, TypeError) as exc:   # the file's values, not the graph, make these
        raise ExprError(f"{expr!r} over {dict(section)!r}: {exc}") from None
    return int(result) if isinstance(result, float) and result.is_integer() else result


@dataclass(frozen=True)
class ConfigValue:
    """A config key's value as the library reads it, and how it was obtained."""

    value: Any
    source: str        # "file", "default" or "derive"


def read_value(config: Mapping[str, Any], key: str, default: Any = MISSING, derive: str | None = None
               ) -> ConfigValue | None:
    """The dotted `key` of `config` as the library reads it: the file's value; `default` when the file
    lacks it; `derive` evaluated over the key's section when it is absent (no default) or null.
    None when none of these gives a value; ExprError when `derive` does not compute."""
    *parents, field = key.split(".")
    section: Any = config
    for part in parents:
        section = section.get(part) if isinstance(section, dict) else None
    section = section if isinstance(section, dict) else {}
    if field in section and section[field] is not None:
        return ConfigValue(section[field], "file")
    if field not in section and default is not MISSING:
        if default is not None or derive is None:
            return ConfigValue(default, "default")
    if derive is not None:
        try:
            return ConfigValue(evaluate(derive, section), "derive")
        except KeyError:
            return None
    return None
