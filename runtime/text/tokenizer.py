"""`TextTokenizer`: text <-> token ids, special tokens and chat template of one checkpoint.

Loaded once per LM node (runtime.text.loading.load_tokenizer), from
  * an HF checkpoint directory: `tokenizer.json` (the `tokenizers` package runs it),
    `tokenizer_config.json` (special tokens, `chat_template`),
    `chat_template.jinja` if present, `generation_config.json` (extra EOS ids);
  * a GGUF file, a directory with one, or `gguf:<package>` (see runtime.model_executor.weights.gguf_loader):
    the vocabulary, merges, special ids and chat template in its metadata
    (`runtime.text.gguf_tokenizer`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tokenizers import Tokenizer

from runtime.text.chat_template import ChatTemplate, ChatTemplateError

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass
class TextTokenizer:
    """A `tokenizers.Tokenizer` plus what the checkpoint says about special tokens and chat."""

    backend: Tokenizer                  # its post-processor adds BOS/EOS where the checkpoint wants them
    special_tokens: dict[str, str] = field(default_factory=dict)   # bos_token/eos_token/... -> text
    chat_template: ChatTemplate | None = None
    extra_eos_token_ids: tuple[int, ...] = ()   # e.g. generation_config.json's eos list, GGUF eot

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, name: str) -> int | None:
        """Id of a named special token ("bos_token", "eos_token", ...), None if absent."""
        text = self.special_tokens.get(name)
        return None if text is None else self.backend.token_to_id(text)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id("eos_token")

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every id that ends a generation (the stop set before request params)."""
        eos = self.eos_token_id
        return frozenset((*(() if eos is None else (eos,)), *self.extra_eos_token_ids))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` lets the post-processor add BOS etc."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    **variables: Any) -> str:
        """The chat prompt as text (special tokens spelt out), as transformers renders it."""
        if self.chat_template is None:
            raise ChatTemplateError("this model has no chat template; send a plain completion prompt")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                         **{**self.special_tokens, **variables})

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    **variables: Any) -> list[int]:
        """Token ids of the chat prompt (the template writes any BOS itself)."""
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, **variables)
        return self.encode(text, add_special_tokens=False)


def tokenizer_from_dir(path: Path) -> TextTokenizer:
    """An HF checkpoint directory's tokenizer (tokenizer.json + tokenizer_config.json).

    tokenizer.json's post-processor decides BOS/EOS, as transformers 5's fast tokenizers do.
    """
    config = _read_json(path / "tokenizer_config.json")
    special = {name: _token_text(config[name]) for name in SPECIAL_TOKEN_NAMES if config.get(name)}
    backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    template = _dir_chat_template(path, config)
    return TextTokenizer(backend=backend, special_tokens=special,
                         chat_template=ChatTemplate(template) if template else None,
                         extra_eos_token_ids=_generation_eos_ids(path))


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _token_text(value: str | Mapping[str, Any]) -> str:
    """tokenizer_config spells a special token as text or as an AddedToken dict."""
    return value["content"] if isinstance(value, Mapping) else value


def _dir_chat_template(path: Path, config: Mapping[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template") or _read_json(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):   # named templates: [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def _generation_eos_ids(path: Path) -> tuple[int, ...]:
    eos = _read_json(path / "generation_config.json").get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255: for LMs with seeded random weights and no vocabulary."""

    eos_token_ids: frozenset[int] = frozenset()

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def render_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
        return "\n".join(lines) + ("\nassistant: " if add_generation_prompt else "")
