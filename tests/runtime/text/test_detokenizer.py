"""Incremental detokenisation never splits a character and adds up to the full decode."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from runtime.text import TextTokenizer
from runtime.text.detokenizer import IncrementalDetokenizer

STREAMED = [
    "Emoji: 😀👍🏽 and a family 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵!",
    "中文和日本語のテキスト、한국어도 있어요。",
    "Mixed: naïve café → ∑ x² ≤ ∞ 🐍🔥 done",
]


def _pushed(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.push(t) for t in ids] + [detok.flush()]


@pytest.mark.parametrize("text", STREAMED)
def test_deltas_add_up_and_never_hold_replacement_chars(smollm2_tokenizer: TextTokenizer, text: str) -> None:
    ids = smollm2_tokenizer.encode(text)
    deltas = _pushed(IncrementalDetokenizer(smollm2_tokenizer), ids)
    assert len(ids) > len(text.encode("utf-8")) / 4          # multi-byte characters span tokens here
    assert "".join(deltas) == smollm2_tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)
    assert sum(d == "" for d in deltas) > 1                   # some tokens held back a partial character


def test_prompt_context_is_not_repeated(smollm2_tokenizer: TextTokenizer) -> None:
    prompt = smollm2_tokenizer.encode("Say hi: ")
    out = smollm2_tokenizer.encode("👋 hi")
    deltas = _pushed(IncrementalDetokenizer(smollm2_tokenizer, prompt), out)
    full = smollm2_tokenizer.decode(prompt + out)
    assert "".join(deltas) == full[len(smollm2_tokenizer.decode(prompt)):] == "👋 hi"


def test_special_tokens_are_skipped_or_kept(smollm2_tokenizer: TextTokenizer) -> None:
    ids = smollm2_tokenizer.encode("<|im_start|>ok 😀<|im_end|>")
    assert "".join(_pushed(IncrementalDetokenizer(smollm2_tokenizer), ids)) == "ok 😀"
    kept = _pushed(IncrementalDetokenizer(smollm2_tokenizer, skip_special_tokens=False), ids)
    assert "".join(kept) == "<|im_start|>ok 😀<|im_end|>"


def test_truncated_character_is_released_by_flush(smollm2_tokenizer: TextTokenizer) -> None:
    ids = smollm2_tokenizer.encode("ok 😀")[:-1]                # the emoji's last byte never arrives
    detok = IncrementalDetokenizer(smollm2_tokenizer)
    pushed = [detok.push(t) for t in ids]
    assert "".join(pushed) == "ok"
    tail = detok.flush()
    assert "\ufffd" in tail and "".join(pushed) + tail == smollm2_tokenizer.decode(ids)


def test_context_dependent_decoding() -> None:
    # SentencePiece-style: "▁" is a space except at the start of the text, so a token
    # decoded on its own loses its space; the detokeniser's window keeps it.
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3, "▁again": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tok = TextTokenizer(backend=backend)
    ids = [1, 2, 3, 4]
    assert tok.decode([2]) == "world"
    deltas = _pushed(IncrementalDetokenizer(tok), ids)
    assert "".join(deltas) == tok.decode(ids) == "Hello world! again"
