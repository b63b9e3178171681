"""Shared fixture for the text tests: SmolLM2's GGUF tokenizer (parsed once per session)."""
from __future__ import annotations

import pytest

from runtime.text import TextTokenizer
from runtime.text.gguf_tokenizer import tokenizer_from_gguf
from runtime.model_executor.weights.gguf_loader import SMOLLM2


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> TextTokenizer:
    return tokenizer_from_gguf(SMOLLM2)
