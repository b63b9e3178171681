"""transformers' Whisper as the reference for mstar's (tests/runtime/serving/speech/test_whisper.py, the
`whisper` bench suite): a seeded random `WhisperForConditionalGeneration` whose text tokens win over the
special ones (so greedy transcripts hold text and never stop early), its generation config, and a
byte-level tokenizer with Whisper's special tokens in Whisper's order after the text vocabulary.

The model is transformers' own (random init, seeded); the special-token layout of the generation config
and the tokenizer is written here from Whisper's published order, not from mstar's tokens.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

from bench.byte_tokenizer import write_byte_tokenizer

# Whisper's language codes in token order (openai/whisper/tokenizer.py's LANGUAGES, Cantonese last)
CODES = ("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt la "
         "mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc ka be "
         "tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue").split()
TEXT = 256              # the tiny preset's text vocabulary: bytes


def special_names(num_languages: int = 100) -> list[str]:
    return (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{c}|>" for c in CODES[:num_languages]]
            + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
               "<|notimestamps|>"] + [f"<|{i * 0.02:.2f}|>" for i in range(1501)])


def config(dims: Mapping[str, Any]) -> WhisperConfig:
    names = special_names(dims["num_languages"])
    return WhisperConfig(
        vocab_size=dims["text_vocab_size"] + len(names), num_mel_bins=dims["num_mel_bins"], d_model=dims["d_model"],
        encoder_layers=dims["encoder_layers"], decoder_layers=dims["decoder_layers"],
        encoder_attention_heads=dims["encoder_attention_heads"],
        decoder_attention_heads=dims["decoder_attention_heads"],
        encoder_ffn_dim=dims["encoder_ffn_dim"], decoder_ffn_dim=dims["decoder_ffn_dim"],
        max_source_positions=dims["max_source_positions"], max_target_positions=dims["max_target_positions"],
        decoder_start_token_id=dims["text_vocab_size"] + 1, eos_token_id=dims["text_vocab_size"],
        pad_token_id=dims["text_vocab_size"], bos_token_id=dims["text_vocab_size"])


def model(dims: Mapping[str, Any], seed: int = 0, special_scale: float = 0.05) -> WhisperForConditionalGeneration:
    """A seeded random tiny Whisper whose special-token embedding rows are scaled down by `special_scale`
    (its logits are those rows times the final states) and whose decoder matrices are drawn wider than
    transformers' init (which repeats one token): greedy decoding then writes varied text bytes."""
    text = dims["text_vocab_size"]
    torch.manual_seed(seed)
    hf = WhisperForConditionalGeneration(config(dims)).eval()
    draw = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():   # wider decoder matrices than transformers' init (cross-attention's widest): the
        for name, p in hf.model.decoder.named_parameters():     # greedy text varies, with the audio too
            if p.dim() == 2 and "embed_tokens" not in name:
                p.copy_(torch.randn(p.shape, generator=draw) * (0.3 if "encoder_attn" in name else 0.1))
        hf.model.decoder.embed_tokens.weight[text:] *= special_scale
    names = special_names(dims["num_languages"])
    ids = {name: text + i for i, name in enumerate(names)}
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=text + 1, eos_token_id=text, pad_token_id=text, bos_token_id=text,
        is_multilingual=True, lang_to_id={n: ids[n] for n in names[2:2 + dims["num_languages"]]},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        no_timestamps_token_id=ids["<|notimestamps|>"], prev_sot_token_id=ids["<|startofprev|>"],
        max_initial_timestamp_index=50, suppress_tokens=None, begin_suppress_tokens=None,
        max_length=dims["max_target_positions"])
    return hf


def write_tokenizer(directory: Path, num_languages: int = 100, text: int = TEXT) -> Tokenizer:
    """A byte-level tokenizer (ids 0..255 the bytes, no merges; ids 256..text-1 filler words that no text
    encodes to) with Whisper's specials after them."""
    return write_byte_tokenizer(directory, special_names(num_languages), text)


def generate(hf: WhisperForConditionalGeneration, features: torch.Tensor, language: str | None, task: str,
             max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy Whisper generate without timestamps of a batch of windows: each row's new tokens."""
    with torch.no_grad():
        out = hf.generate(features, language=language, task=task, max_new_tokens=max_new_tokens, do_sample=False,
                          return_timestamps=False)
    return (out if isinstance(out, torch.Tensor) else out["sequences"]).tolist()


def generate_timestamped(hf: WhisperForConditionalGeneration, features: torch.Tensor, prompt: list[int],
                         max_new_tokens: int) -> list[int]:
    """A greedy loop over transformers' Whisper forward under its WhisperTimeStampLogitsProcessor (what its
    generate applies with return_timestamps=True), one window, `prompt` its <|startoftranscript|> <|lang|>
    <|task|>: the tokens written, timestamps included, up to end of text."""
    ids = torch.tensor([prompt])
    rules = WhisperTimeStampLogitsProcessor(hf.generation_config, begin_index=len(prompt))
    eot = hf.generation_config.eos_token_id
    written: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(rules(ids, hf(input_features=features, decoder_input_ids=ids).logits[:, -1])[0].argmax())
            written.append(token)
            if token == eot:
                break
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return written
