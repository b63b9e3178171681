"""`derive:` expressions of weight-mapping config entries, and how a config key is read (file, default,
derivation), on hand-written configs; the seed mappings against the libraries themselves are in
tests/runtime/weights/test_config_library.py."""
from __future__ import annotations

import pytest

from mstar_compiler.config_expr import ExprError, evaluate, names, parse, read_value


@pytest.mark.parametrize("expr,why", [
    ("a.b", "Attribute is not allowed"), ("f(x)", "Call is not allowed"), ("1.5", "only integer literals"),
    ("-a", "UnaryOp is not allowed"), ("a @ b", "MatMult is not allowed"), ("a +", "not an expression"),
    ("__import__('os')", "Call is not allowed")])
def test_expressions_outside_the_grammar_are_refused(expr: str, why: str) -> None:
    with pytest.raises(ExprError, match=why):
        parse(expr)


def test_an_expression_reads_the_keys_beside_its_own() -> None:
    section = {"image_size": 768, "patch_size": 16, "hidden_size": 3072, "num_attention_heads": 24}
    assert evaluate("(image_size // patch_size) ** 2", section) == 2304
    assert evaluate("hidden_size / num_attention_heads", section) == 128 and names("a * b + a") == ["a", "b"]
    with pytest.raises(KeyError, match="depth"):
        evaluate("depth + 1", section)
    with pytest.raises(ExprError, match="by zero"):
        evaluate("hidden_size // zero", {**section, "zero": 0})
    with pytest.raises(ExprError, match="exponent 1000"):
        evaluate("2 ** e", {"e": 1000})   # a config file's value must not make the reader compute for ever


def test_the_file_then_the_default_then_the_derivation() -> None:
    config = {"text": {"num_attention_heads": 24, "num_key_value_heads": 8}}
    assert read_value(config, "text.num_key_value_heads", 32, "num_attention_heads").source == "file"
    absent = {"text": {"num_attention_heads": 24}}
    assert read_value(absent, "text.num_key_value_heads", 32, "num_attention_heads").value == 32   # Qwen2Config
    assert read_value(absent, "text.num_key_value_heads", derive="num_attention_heads").value == 24   # LlamaConfig
    null = {"text": {"num_attention_heads": 24, "num_key_value_heads": None}}
    assert read_value(null, "text.num_key_value_heads", 32, "num_attention_heads").value == 24
    assert read_value(null, "text.num_key_value_heads", 32) is None, "null without a derivation: no value"
    assert read_value({}, "text.num_key_value_heads", derive="num_attention_heads") is None, "its input is missing"
    assert read_value({}, "text.depth") is None and read_value({}, "a.b.c", [8, 16]).value == [8, 16]
