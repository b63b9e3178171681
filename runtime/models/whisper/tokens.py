"""Whisper's special tokens, located from the decoder's dims (mstar_compiler/catalogue/whisper.py), and
the decoder prompts the server writes.

A prompt is `[memory placeholders] [memory padding] [<|startofprev|> previous text] <|startoftranscript|> <|lang|>
<|task|> [<|notimestamps|>]`; without a language it stops after <|startoftranscript|>, and the decoder's
executor has the model pick the language among the language tokens only, then the task and timestamp
tokens follow as the request asked (runtime/models/whisper/executors.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from mstar_compiler.catalogue.whisper import NUM_TIMESTAMPS, vocab_size

# Whisper's languages in its token order (openai/whisper's tokenizer); large-v3 adds Cantonese
LANGUAGES = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id", "hi",
    "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg", "lt", "la",
    "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy",
    "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be",
    "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
)
# their English names, as verbose_json answers them (openai/whisper's LANGUAGES values)
LANGUAGE_NAMES = (
    "english", "chinese", "german", "spanish", "russian", "korean", "french", "japanese", "portuguese", "turkish",
    "polish", "catalan", "dutch", "arabic", "swedish", "italian", "indonesian", "hindi", "finnish", "vietnamese",
    "hebrew", "ukrainian", "greek", "malay", "czech", "romanian", "danish", "hungarian", "tamil", "norwegian",
    "thai", "urdu", "croatian", "bulgarian", "lithuanian", "latin", "maori", "malayalam", "welsh", "slovak",
    "telugu", "persian", "latvian", "bengali", "serbian", "azerbaijani", "slovenian", "kannada", "estonian",
    "macedonian", "breton", "basque", "icelandic", "armenian", "nepali", "mongolian", "bosnian", "kazakh",
    "albanian", "swahili", "galician", "marathi", "punjabi", "sinhala", "khmer", "shona", "yoruba", "somali",
    "afrikaans", "occitan", "georgian", "belarusian", "tajik", "sindhi", "gujarati", "amharic", "yiddish", "lao",
    "uzbek", "faroese", "haitian creole", "pashto", "turkmen", "nynorsk", "maltese", "sanskrit", "luxembourgish",
    "myanmar", "tibetan", "tagalog", "malagasy", "assamese", "tatar", "hawaiian", "lingala", "hausa", "bashkir",
    "javanese", "sundanese", "cantonese",
)
SECONDS_PER_TIMESTAMP = 0.02
MAX_PREVIOUS_TOKENS = 223       # openai/whisper: the previous window's text kept in the prompt


@dataclass(frozen=True)
class WhisperTokens:
    """The ids of Whisper's special tokens for one vocabulary."""

    text_vocab_size: int
    num_languages: int

    @classmethod
    def of(cls, dims: Mapping[str, Any]) -> WhisperTokens:
        return cls(int(dims["text_vocab_size"]), int(dims["num_languages"]))

    @property
    def eot(self) -> int:
        return self.text_vocab_size

    @property
    def sot(self) -> int:
        return self.text_vocab_size + 1

    @property
    def languages(self) -> tuple[str, ...]:
        return LANGUAGES[:self.num_languages]

    def language(self, code: str) -> int | None:
        return self.sot + 1 + self.languages.index(code) if code in self.languages else None

    @property
    def first_language(self) -> int:
        return self.sot + 1

    @property
    def translate(self) -> int:
        return self.sot + 1 + self.num_languages

    @property
    def transcribe(self) -> int:
        return self.translate + 1

    @property
    def start_of_lm(self) -> int:
        """Never in a transcription prompt: the padding rows after the memory."""
        return self.translate + 2

    @property
    def start_of_prev(self) -> int:
        return self.translate + 3

    @property
    def no_speech(self) -> int:
        """Never in a prompt nor chosen by the executor: the memory rows' placeholder."""
        return self.translate + 4

    @property
    def no_timestamps(self) -> int:
        return self.translate + 5

    @property
    def first_timestamp(self) -> int:
        return self.translate + 6

    @property
    def vocab_size(self) -> int:
        return vocab_size({"text_vocab_size": self.text_vocab_size, "num_languages": self.num_languages})

    def is_timestamp(self, token: int) -> bool:
        return self.first_timestamp <= token < self.first_timestamp + NUM_TIMESTAMPS

    def seconds(self, token: int) -> float:
        return (token - self.first_timestamp) * SECONDS_PER_TIMESTAMP

    def language_of(self, token: int) -> str | None:
        at = token - self.first_language
        return self.languages[at] if 0 <= at < self.num_languages else None

    def prompt(self, memory_rows: int, language: str | None, task: str, timestamps: bool,
               previous: Sequence[int] = (), block: int = 1) -> list[int]:
        """The decoder's prompt for one window (module docstring); `previous` are text token ids. The memory
        is padded to a multiple of `block` rows (the decoder's KV block: its text then starts on a block)."""
        ids = [self.no_speech] * memory_rows + [self.start_of_lm] * (-memory_rows % block)
        if previous:
            ids += [self.start_of_prev, *list(previous)[-MAX_PREVIOUS_TOKENS:]]
        ids.append(self.sot)
        if language is not None:
            lang = self.language(language)
            assert lang is not None, language
            ids += [lang, self.translate if task == "translate" else self.transcribe]
            if not timestamps:
                ids.append(self.no_timestamps)
        return ids

    def forced_after_language(self, task: str, timestamps: bool) -> list[int]:
        """What follows a language the model picked: the task token, and <|notimestamps|> without timestamps."""
        return [self.translate if task == "translate" else self.transcribe] + ([] if timestamps else
                                                                                [self.no_timestamps])


def check_tokenizer(tokens: WhisperTokens, tokenizer: Any) -> None:
    """Raise ValueError when a checkpoint's tokenizer puts Whisper's special tokens elsewhere than the
    model's dims say (a tokenizer of another Whisper generation): its transcripts would be garbage. A
    tokenizer without named tokens (the byte tokenizer of seeded random weights) has nothing to check."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        return
    named = {"<|endoftext|>": tokens.eot, "<|startoftranscript|>": tokens.sot, "<|en|>": tokens.language("en"),
             "<|transcribe|>": tokens.transcribe, "<|notimestamps|>": tokens.no_timestamps,
             "<|0.00|>": tokens.first_timestamp}
    wrong = [f"{name} is {backend.token_to_id(name)}, the model's layout says {want}"
             for name, want in named.items() if backend.token_to_id(name) != want]
    if wrong:
        raise ValueError("the checkpoint's tokenizer does not match the decoder's special tokens "
                         f"(text_vocab_size {tokens.text_vocab_size}, {tokens.num_languages} languages): "
                         + "; ".join(wrong))
