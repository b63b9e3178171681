"""Tokenizers from an HF checkpoint directory, against transformers on the same files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from runtime.text import TextTokenizer, load_tokenizer
from runtime.text.tokenizer import tokenizer_from_dir
from runtime.model_executor.weights.gguf_loader import SMOLLM2


def _checkpoint_dir(path: Path, source: TextTokenizer, **config: object) -> Path:
    source.backend.save(str(path / "tokenizer.json"))
    base = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
            "bos_token": {"__type": "AddedToken", "content": "<|im_start|>", "special": True},
            "chat_template": [{"name": "default", "template": source.chat_template.source},
                              {"name": "tool_use", "template": "unused"}]}
    (path / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    return path


def test_directory_tokenizer_matches_transformers(tmp_path: Path, smollm2_tokenizer: TextTokenizer) -> None:
    ours = load_tokenizer(_checkpoint_dir(tmp_path, smollm2_tokenizer))
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    for text in ("Hello 😀 world 42", "<|im_start|>user\n日本<|im_end|>"):
        assert ours.encode(text) == theirs.encode(text)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert ours.render_chat(messages) == theirs.apply_chat_template(messages, tokenize=False,
                                                                    add_generation_prompt=True)
    assert ours.bos_token_id == theirs.bos_token_id == 1
    assert ours.eos_token_ids == {0, 2}        # generation_config.json's list joins the tokenizer's EOS


def test_chat_template_jinja_file_wins(tmp_path: Path, smollm2_tokenizer: TextTokenizer) -> None:
    _checkpoint_dir(tmp_path, smollm2_tokenizer)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert tokenizer_from_dir(tmp_path).render_chat([{"role": "user", "content": "x"}]) == "[x]"


def test_model_without_chat_template_says_so(tmp_path: Path, smollm2_tokenizer: TextTokenizer) -> None:
    tok = tokenizer_from_dir(_checkpoint_dir(tmp_path, smollm2_tokenizer, chat_template=None))
    with pytest.raises(ValueError, match="no chat template"):
        tok.render_chat([{"role": "user", "content": "x"}])


def test_load_tokenizer_reads_gguf_references(tmp_path: Path) -> None:
    tok = load_tokenizer(SMOLLM2)
    assert tok.vocab_size == 49152 and tok.chat_template is not None
    with pytest.raises(FileNotFoundError, match="no installed package"):
        load_tokenizer("gguf:no_such_package_xyz")
    with pytest.raises(FileNotFoundError, match="exactly one .gguf"):
        load_tokenizer(tmp_path)
