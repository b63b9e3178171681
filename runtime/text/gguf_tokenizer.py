"""A `TextTokenizer` rebuilt from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json; llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`),
the token types, the BPE merges, the special ids and the chat template as metadata.
Byte-level BPE vocabularies (`tokenizer.ggml.model == "gpt2"`, as SmolLM2's) become a
`tokenizers` BPE model with the GPT-2 byte-level pre-tokenizer and decoder. The split
before byte-level BPE follows llama.cpp's `tokenizer.ggml.pre`: "smollm" (and the others
that share its rule) puts every digit in its own piece first, exactly as SmolLM2's own
tokenizer.json does; "default"/"gpt2" uses the GPT-2 regex alone.

With `tokenizer.ggml.add_bos_token` the post-processor puts BOS first, as llama.cpp does.
Tokens of type CONTROL (3) become special added tokens (matched whole in text, dropped
by `decode(skip_special_tokens=True)`); USER_DEFINED (4) become plain added tokens.

Reading a GGUF's metadata with the `gguf` package takes seconds (SmolLM2's 49k tokens and merges:
~5 s here), and the server and every worker that samples under a grammar need the tokenizer: the
rebuilt one is kept as `tokenizer.json` plus its specials and template in $MSTAR_CACHE, keyed by
the GGUF's path, size and mtime as its safetensors copy is, and read from there (~0.3 s) after.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from runtime.text.chat_template import ChatTemplate
from runtime.text.tokenizer import TextTokenizer
from runtime.model_executor.weights.gguf_loader import GGUFCheckpoint, gguf_cache_path, open_gguf, resolve_gguf

_CONTROL, _USER_DEFINED = 3, 4
# llama.cpp pre-tokenizer names whose rule is "each digit alone, then the GPT-2 regex"
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
_GPT2 = ("default", "gpt2")
# GGUF special-id key -> TextTokenizer special token name
_SPECIAL_IDS = {
    "tokenizer.ggml.bos_token_id": "bos_token",
    "tokenizer.ggml.eos_token_id": "eos_token",
    "tokenizer.ggml.unknown_token_id": "unk_token",
    "tokenizer.ggml.padding_token_id": "pad_token",
}
_EXTRA_EOS_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def tokenizer_from_gguf(ref: str | os.PathLike[str] | GGUFCheckpoint) -> TextTokenizer:
    """The tokenizer a GGUF's metadata describes (`ref`: path, dir, `gguf:<package>` or opened); a file's
    from the cache when it was rebuilt before (module docstring)."""
    if isinstance(ref, GGUFCheckpoint):
        return _rebuilt(ref)
    cached = gguf_cache_path(resolve_gguf(ref), ".tokenizer")
    if (cached / _META).is_file():
        return _read_cached(cached)
    tokenizer = _rebuilt(open_gguf(os.fspath(ref)))
    _write_cached(tokenizer, cached)
    return tokenizer


_META = "mstar_tokenizer.json"     # written last: a directory holding it is whole


def _write_cached(tokenizer: TextTokenizer, target: Path) -> None:
    """`tokenizer` into `target`, whole or not at all (another process may write the same one at once)."""
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer.backend.save(str(tmp / "tokenizer.json"))
    meta = {"special_tokens": tokenizer.special_tokens, "extra_eos_token_ids": list(tokenizer.extra_eos_token_ids),
            "chat_template": tokenizer.chat_template.source if tokenizer.chat_template else None}
    (tmp / _META).write_text(json.dumps(meta))
    try:
        tmp.rename(target)
    except OSError:          # another process's copy is there already
        shutil.rmtree(tmp, ignore_errors=True)


def _read_cached(path: Path) -> TextTokenizer:
    meta = json.loads((path / _META).read_text())
    template = meta["chat_template"]
    return TextTokenizer(backend=Tokenizer.from_file(str(path / "tokenizer.json")),
                         special_tokens=meta["special_tokens"],
                         chat_template=ChatTemplate(template) if template else None,
                         extra_eos_token_ids=tuple(meta["extra_eos_token_ids"]))


def _rebuilt(ckpt: GGUFCheckpoint) -> TextTokenizer:
    """The tokenizer rebuilt from an opened GGUF's metadata."""
    tokens: list[str] = ckpt.get("tokenizer.ggml.tokens")
    template = ckpt.get("tokenizer.chat_template")
    backend = _byte_level_bpe(ckpt, tokens)
    bos_id = ckpt.get("tokenizer.ggml.bos_token_id")
    if ckpt.get("tokenizer.ggml.add_bos_token", False) and bos_id is not None:
        bos = tokens[bos_id]
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    return TextTokenizer(
        backend=backend,
        special_tokens={name: tokens[i] for key, name in _SPECIAL_IDS.items()
                        if (i := ckpt.get(key)) is not None},
        chat_template=ChatTemplate(template) if template else None,
        extra_eos_token_ids=tuple(i for key in _EXTRA_EOS_KEYS if (i := ckpt.get(key)) is not None),
    )


def _byte_level_bpe(ckpt: GGUFCheckpoint, tokens: list[str]) -> Tokenizer:
    kind = ckpt.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{ckpt.path}: GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2')")
    merges = [tuple(m.split(" ")) for m in ckpt.get("tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(ckpt)
    backend.decoder = decoders.ByteLevel()
    types: list[int] = ckpt.get("tokenizer.ggml.token_type", [])
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, token_type in zip(tokens, types) if token_type == _CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, token_type in zip(tokens, types) if token_type == _USER_DEFINED])
    return backend


def _pre_tokenizer(ckpt: GGUFCheckpoint) -> pre_tokenizers.PreTokenizer:
    pre = ckpt.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2:
        return byte_level
    raise ValueError(f"{ckpt.path}: GGUF pre-tokenizer {pre!r} is not supported "
                     f"(supported: {', '.join(_GPT2 + _DIGITS_THEN_GPT2)})")
