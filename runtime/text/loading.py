"""Which tokenizer a checkpoint has: its directory's `tokenizer.json` (a diffusers pipeline's repository keeps
it in `tokenizer/`), or a GGUF file's metadata."""
from __future__ import annotations

import os
from pathlib import Path

from runtime.text.tokenizer import ByteTokenizer, TextTokenizer, tokenizer_from_dir


def load_tokenizer(source: str | os.PathLike[str]) -> TextTokenizer:
    """The tokenizer of a checkpoint directory, a GGUF file, or `gguf:<package>`."""
    text = os.fspath(source)
    path = Path(text)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return tokenizer_from_dir(path)
    if path.is_dir() and (path / "tokenizer" / "tokenizer.json").is_file():
        return tokenizer_from_dir(path / "tokenizer")
    from runtime.text.gguf_tokenizer import tokenizer_from_gguf   # the gguf package: only for GGUF sources
    return tokenizer_from_gguf(text)


def load_text_tokenizer(weight_ref: str | None) -> TextTokenizer | ByteTokenizer:
    """The tokenizer of the LM's checkpoint, or a byte tokenizer for seeded random weights."""
    return load_tokenizer(weight_ref) if weight_ref else ByteTokenizer()
