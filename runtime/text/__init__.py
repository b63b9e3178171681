"""Text side of language models: tokenizers, chat templates, output text (`TextOutput`, the one way to detokenise)."""
from __future__ import annotations

from runtime.text.chat_template import ChatTemplate, ChatTemplateError
from runtime.text.output import TextOutput, TextOutputDelta, output_text
from runtime.text.loading import load_text_tokenizer, load_tokenizer
from runtime.text.tokenizer import ByteTokenizer, TextTokenizer

__all__ = [
    "ByteTokenizer",
    "ChatTemplate",
    "ChatTemplateError",
    "TextOutputDelta",
    "TextOutput",
    "TextTokenizer",
    "load_text_tokenizer",
    "load_tokenizer",
    "output_text",
]
