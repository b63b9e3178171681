"""A byte-level BPE tokenizer without merges for tiny reference checkpoints: ids 0..255 the bytes, then
filler words no text encodes to, then the model's special tokens, saved as a `tokenizers` tokenizer.json."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def write_byte_tokenizer(directory: Path, specials: list[str], text: int = 256,
                         eos: str = "<|endoftext|>", bos: str | None = None) -> Tokenizer:
    """directory/tokenizer.json (+ tokenizer_config.json naming `eos` and `bos`): ids 0..255 the bytes,
    256..text-1 filler words, `specials` from id `text` on."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    vocab.update({f"w{i}": i for i in range(256, text)})
    tok = Tokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"eos_token": eos, **({"bos_token": bos} if bos else {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


@cache
def _byte_table() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _byte_of(char: str) -> int:
    """The byte GPT-2's byte-to-unicode table maps to `char`."""
    return _byte_table()[char]
