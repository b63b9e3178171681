"""Whisper speech recognition family: `whisper_encoder` and `whisper_decoder`. Torch-free.

An encoder–decoder: the encoder turns one 30 s window of 16 kHz audio (log-mel, 100 frames a
second, two convolutions halving it) into 1,500 hidden rows; the decoder is a text LM whose every
layer also attends to those rows (cross-attention). Dims use the key names of transformers'
`WhisperConfig` (d_model, encoder_layers, decoder_layers, encoder_attention_heads, ...).

Cross-attention memory: the decoder's `embeds` input is its **memory**, not rows of its prompt.
The request's prompt holds one placeholder (`memory_token_id`) per memory row, ahead of its text;
the decoder writes those rows' cross-attention keys and values (`encoder_attn.k_proj / v_proj` of
the encoder's output) into its paged KV cache at their positions, once, and every later row of the
request attends to them read-only, while its self-attention reads only the rows after them. So the
memory is paged, charged and freed with the request's KV like any of its rows (one K and one V per
layer per row, `kv_bytes_per_token` counts both kinds alike), admission is exact from the first
Run, and nothing outside the family's component and executor knows it is there.

Token layout: Whisper's special tokens follow its text vocabulary in a fixed order
(runtime/models/whisper/tokens.py): end of text, start of transcript, one per language, translate,
transcribe, start of LM, start of previous text, no speech, no timestamps, then 1,501 timestamps
(0.00 .. 30.00 s). `text_vocab_size` and `num_languages` fix every id: large-v3's text vocabulary is
GPT-2's 50,257 tokens with 100 languages; the tiny preset's is 256 bytes.
"""
from __future__ import annotations

from mstar_compiler.catalogue import Dims, Family, KindSpec, Port

NUM_TIMESTAMPS = 1501          # <|0.00|> .. <|30.00|> in steps of 0.02 s
SPECIALS_BEFORE_LANGUAGES = 2  # end of text, start of transcript
SPECIALS_AFTER_LANGUAGES = 6   # translate, transcribe, start of LM, start of previous, no speech, no timestamps


def vocab_size(d: Dims) -> int:
    """The decoder's vocabulary: text, then the special tokens in Whisper's order (module docstring)."""
    return (d["text_vocab_size"] + SPECIALS_BEFORE_LANGUAGES + d["num_languages"] + SPECIALS_AFTER_LANGUAGES
            + NUM_TIMESTAMPS)


def _linear(c_in: int, c_out: int, bias: bool = True) -> int:
    return c_in * c_out + (c_out if bias else 0)


def _attention(d_model: int) -> int:
    """q, k (no bias), v, out projections."""
    return 3 * _linear(d_model, d_model) + _linear(d_model, d_model, bias=False)


def _mlp(d_model: int, ffn: int) -> int:
    return _linear(d_model, ffn) + _linear(ffn, d_model)


def encoder_params(d: Dims) -> int:
    """Exact parameter count of the runtime `whisper_encoder` module."""
    h = d["d_model"]
    convs = _linear(d["num_mel_bins"] * 3, h) + _linear(h * 3, h)
    layer = 2 * 2 * h + _attention(h) + _mlp(h, d["encoder_ffn_dim"])
    return convs + d["max_source_positions"] * h + d["encoder_layers"] * layer + 2 * h


def decoder_params(d: Dims) -> int:
    """Exact parameter count of the runtime `whisper_decoder` module (its LM head is the token embedding)."""
    h = d["d_model"]
    layer = 3 * 2 * h + 2 * _attention(h) + _mlp(h, d["decoder_ffn_dim"])
    return (vocab_size(d) + d["max_target_positions"]) * h + d["decoder_layers"] * layer + 2 * h


def decoder_kv_bytes_per_token(d: Dims, dtype_bytes: int) -> int:
    """One K and one V per layer for a row: a token's self-attention or a memory row's cross-attention."""
    return d["decoder_layers"] * 2 * d["d_model"] * dtype_bytes


# begin_suppress_tokens: what the published generation config forbids as a window's first written token (" " and
# end of text); the tiny preset forbids nothing, as the reference it is tested against
_WINDOW = {"num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448, "text_vocab_size": 50257,
           "num_languages": 99, "layer_norm_eps": 1e-5, "sampling_rate": 16000, "chunk_length": 30,
           "begin_suppress_tokens": [220, 50257]}
_TINY = {**_WINDOW, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
         "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "text_vocab_size": 256,
         "num_languages": 100, "begin_suppress_tokens": []}
PRESETS = {
    "tiny": _TINY,
    # openai/whisper-base: the mid-size preset for CPU benchmarks (its published vocabulary, 99 languages)
    "base": {**_WINDOW, "d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
             "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048},
    # openai/whisper-large-v3: 128 mel bins, 100 languages (Cantonese added), 32 + 32 layers
    "large-v3": {**_WINDOW, "num_mel_bins": 128, "num_languages": 100, "d_model": 1280, "encoder_layers": 32,
                 "decoder_layers": 32, "encoder_attention_heads": 20, "decoder_attention_heads": 20,
                 "encoder_ffn_dim": 5120, "decoder_ffn_dim": 5120},
}

ARGS = {"weights": None, "seed": 0}

WHISPER_ENCODER = KindSpec(
    kind="whisper_encoder",
    doc="Whisper audio encoder: one 30 s window of 16 kHz audio -> 1,500 hidden rows",
    inputs=(Port("audio", "audio", ("S",)),),
    outputs=(Port("hidden", "hidden", ("T", "d_model")),),
    presets=PRESETS,
    num_params=encoder_params,
    can_batch=True,
    is_capture_safe=True,
    tp_divides=("encoder_attention_heads",),
    args=ARGS,
    executor="whisper_encoder",
    layer_dim="encoder_layers",
)

WHISPER_DECODER = KindSpec(
    kind="whisper_decoder",
    doc="Whisper text decoder: tokens attend to themselves and, read-only, to the encoder's rows (paged KV)",
    inputs=(
        Port("tokens", "tokens", ("T",)),
        # the cross-attention memory: the encoder's rows, written once at their placeholders (module docstring)
        Port("embeds", "hidden", ("T", "d_model"), optional=True),
    ),
    outputs=(
        Port("token", "tokens", ("T",), stream=True),
        Port("hidden", "hidden", ("T", "d_model"), stream=True),
    ),
    presets=PRESETS,
    num_params=decoder_params,
    has_kv_cache=True,
    can_batch=True,
    is_capture_safe=False,    # a row attends to two differently sized parts of its table
    kv_bytes_per_token=decoder_kv_bytes_per_token,
    tp_divides=("decoder_attention_heads",),
    # the latest first timestamp of a window, in 0.02 s steps (openai/whisper's max_initial_timestamp 1.0 s)
    args={**ARGS, "max_initial_timestamp_index": 50},
    executor="whisper_decoder",
    layer_dim="decoder_layers",
)

KINDS: tuple[KindSpec, ...] = (WHISPER_ENCODER, WHISPER_DECODER)


# the family, declared once: its kinds, and the runtime that implements them (runtime/models/whisper/)
FAMILY = Family(
    "whisper", KINDS,
    components={
        "whisper_encoder": "runtime.models.whisper.whisper_encoder:WhisperEncoder",
        "whisper_decoder": "runtime.models.whisper.whisper_decoder:WhisperDecoder",
    },
    executors={
        "whisper_encoder": "runtime.models.whisper.executors:encoder_executor",
        "whisper_decoder": "runtime.models.whisper.executors:decoder_executor",
    },
    serving="runtime.models.whisper.serving:SERVING",
)
