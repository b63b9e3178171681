"""The `delimited` policy's cutter: clauses released as text is written, every character once, in order."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mstar_compiler.plan import ChunkPolicy
from runtime.streams.text_clauses import TextClauses

DELIMS = [".", "!", "?", ",", "。", "..."]


def written(cutter: TextClauses, pieces: list[str]) -> list[str]:
    out = []
    for piece in pieces:
        out += cutter.append(piece)
    return out + cutter.finish()


def test_clauses_end_at_delimiters_followed_by_space_once_long_enough() -> None:
    cutter = TextClauses([".", ","], min_size=6, max_size=40)
    assert cutter.append("Hi, there. It costs 3.14 dollars") == ["Hi, there."]
    assert cutter.pending == " It costs 3.14 dollars"       # "3.14": no space after the point
    assert cutter.append(", fine.") == [" It costs 3.14 dollars,"]
    assert cutter.pending == " fine."                          # a point at the end may be "..." being written
    assert cutter.finish() == [" fine."] and cutter.pending == ""


def test_non_ascii_delimiters_cut_at_once_and_long_text_is_cut_at_a_space() -> None:
    assert TextClauses(["。"], 2, 40).append("你好。今天") == ["你好。"]
    cutter = TextClauses(["."], 4, 10)
    assert cutter.append("aaaa bbbb cccc dd") == ["aaaa bbbb"]      # 17 > 10 characters: the last space within 10
    assert cutter.finish() == [" cccc dd"]
    assert TextClauses(["."], 4, 6).append("abcdefghij") == ["abcdef"]     # no space: cut at max


def test_whitespace_only_rest_is_dropped_and_a_bad_policy_is_refused() -> None:
    cutter = TextClauses(["."], 2, 20)
    assert cutter.append("Done. ") == ["Done."]
    assert cutter.finish() == []
    with pytest.raises(ValueError, match="1 <= min <= max"):
        TextClauses(["."], 9, 4)
    with pytest.raises(ValueError, match="delimited policy"):
        TextClauses.of(ChunkPolicy(kind="fixed", size=4))
    assert TextClauses.of(ChunkPolicy(kind="delimited", size=64, delimiters=["!"], min_size=8)).max_size == 64


text = st.text(alphabet="ab c.!?,。\n", max_size=300)


@settings(max_examples=300, deadline=None)
@given(text=text, cuts=st.lists(st.integers(0, 300), max_size=12), min_size=st.integers(1, 20),
       extra=st.integers(0, 60))
def test_every_character_once_in_order_and_no_clause_blank_or_too_long(text, cuts, min_size, extra) -> None:
    max_size = min_size + extra
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    clauses = written(TextClauses(DELIMS, min_size, max_size), pieces)
    joined = "".join(clauses)
    assert re.sub(r"\s", "", joined) == re.sub(r"\s", "", text)     # only whitespace of no clause is dropped
    assert all(c in text for c in clauses)
    assert all(c.strip() and len(c) <= max_size for c in clauses)
    # pieces do not matter: the whole text at once is cut the same way
    assert clauses == written(TextClauses(DELIMS, min_size, max_size), [text])
