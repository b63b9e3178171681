"""Tiny GGUF files holding only tokenizer metadata, for the GGUF tokenizer tests."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import gguf


def _byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 byte values (the byte-level BPE base vocabulary)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte] = chr(256 + extra)
            extra += 1
    return [spelling[b] for b in range(256)]


def write_tokenizer_gguf(path: Path, *, model: str = "gpt2", pre: str = "default", add_bos: bool = True,
                         merges: Sequence[str] = ("Ġ t", "h e", "Ġt he", "l l", "Ġ w", "o r", "Ġw or",
                                                  "l d", "Ġwor ld", "1 2")) -> Path:
    """A GGUF holding only tokenizer metadata (plus the few llama keys readers expect)."""
    specials = ["<s>", "</s>", "<pad>"]
    tokens = specials + _byte_alphabet() + [m.replace(" ", "") for m in merges] + ["<think>"]
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials) - 1) + [4]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(merges))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
