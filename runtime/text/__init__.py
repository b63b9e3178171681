"""Text side of language models: tokenizers, chat templates, streaming detokenisation."""
from __future__ import annotations

from runtime.text.chat_template import ChatTemplate, ChatTemplateError
from runtime.text.detokenizer import IncrementalDetokenizer
from runtime.text.output import TextOutputDelta, TextOutput
from runtime.text.loading import load_text_tokenizer, load_tokenizer
from runtime.text.tokenizer import ByteTokenizer, TextTokenizer

__all__ = [
    "ByteTokenizer",
    "ChatTemplate",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "TextOutputDelta",
    "TextOutput",
    "TextTokenizer",
    "load_text_tokenizer",
    "load_tokenizer",
]
