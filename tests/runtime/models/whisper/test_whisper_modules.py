"""mstar's Whisper encoder and decoder against transformers' `WhisperForConditionalGeneration` on the same
random tiny weights: the log-mel features, the encoder's rows, and the decoder's logits from a paged cache
holding two requests' cross-attention memory, one request's prompt and another's decode step in one batch."""
from __future__ import annotations

import pytest
import torch
from transformers import WhisperFeatureExtractor

from bench import whisper_reference as ref
from mstar_compiler.catalogue.whisper import PRESETS
from runtime.model_executor.kv import BlockTables
from runtime.model_executor.kernels import cpu as cpu_kernels
from runtime.models.whisper.whisper_decoder import WhisperDecoder, _layout
from runtime.models.whisper.whisper_encoder import WhisperEncoder

DIMS = PRESETS["tiny"]
MEMORY = DIMS["max_source_positions"]


def modules():
    hf = ref.model(DIMS)
    state = hf.state_dict()
    encoder, decoder = WhisperEncoder(DIMS).eval(), WhisperDecoder(DIMS).eval()
    encoder.load_state_dict({k[len("model.encoder."):]: v for k, v in state.items() if k.startswith("model.encoder.")})
    decoder.load_state_dict({k[len("model.decoder."):]: v for k, v in state.items() if k.startswith("model.decoder.")})
    return hf, encoder, decoder


def waveform(seconds: float, seed: int) -> torch.Tensor:
    return 0.1 * torch.randn(int(seconds * 16000), generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def test_features_and_encoder_rows_equal_transformers() -> None:
    hf, encoder, _ = modules()
    wave = waveform(3.0, 0)
    expected = WhisperFeatureExtractor(feature_size=DIMS["num_mel_bins"])(
        wave.numpy(), sampling_rate=16000, return_tensors="pt").input_features
    mel = encoder.features(wave)
    # transformers computes the STFT in float64 numpy, mstar in float32 torch: log-mel values of order 1
    torch.testing.assert_close(mel, expected[0], atol=1e-4, rtol=0)
    # same fp32 arithmetic over 2 layers of width 64 (different reduction orders only)
    torch.testing.assert_close(encoder(expected), hf.model.encoder(expected).last_hidden_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padding", [0, 4], ids=["gathered", "paged"])
@torch.inference_mode()
def test_decoder_over_paged_memory_matches_transformers_in_a_mixed_batch(padding: int) -> None:
    """1500 memory rows + 4 padding rows put the tokens on a 16-row block: the paged kernels' path where they
    are built (the gather path otherwise, and always without padding)."""
    hf, encoder, decoder = modules()
    extract = WhisperFeatureExtractor(feature_size=DIMS["num_mel_bins"])
    feats = [extract(waveform(s, i).numpy(), sampling_rate=16000, return_tensors="pt").input_features
             for i, s in enumerate((2., 4.))]
    memory = [encoder(f)[0] for f in feats]
    # sot, a language, transcribe / translate, no timestamps (and two text tokens)
    prompts = [[257, 258, 359, 363], [257, 259, 358, 363, 65, 66]]
    region = MEMORY + padding
    cache = decoder.make_kv_cache(300, 16)
    tables = BlockTables(300, 16)
    tables.take(0, 0, list(range(0, 120)), [], cache)
    tables.take(1, 0, list(range(120, 240)), [], cache)

    def rows(prompt: list[int]) -> tuple[list[int], list[int]]:
        return [0] * region + prompt, [-1] * MEMORY + [-2] * padding + list(range(len(prompt)))
    # request 1 is ahead: its memory and prompt first, alone
    ids, learned = rows(prompts[1])
    tables.grow(1, len(ids))
    decoder(torch.tensor(ids), torch.tensor([learned, [MEMORY] * len(ids)]), tables.metadata([(1, len(ids))]), cache,
            embeds=memory[1])
    # then one batch: request 0's memory and prompt, request 1's next token
    ids, learned = rows(prompts[0])
    tables.grow(0, len(ids))
    tables.grow(1, 1)
    positions = torch.tensor([learned + [len(prompts[1])], [MEMORY] * (len(ids) + 1)])
    batch = tables.metadata([(0, len(ids)), (1, 1)])
    kernels = cpu_kernels.status() == ""
    layout = _layout(positions, batch, cache.padding_slot, torch.device("cpu"), kernels)
    assert layout.paged == (kernels and padding > 0)
    hidden = decoder(torch.tensor(ids + [70]), positions, batch, cache, embeds=memory[0])
    got = decoder.compute_logits(hidden[[len(ids) - 1, -1]])
    want = [hf(input_features=feats[0], decoder_input_ids=torch.tensor([prompts[0]])).logits[0, -1],
            hf(input_features=feats[1], decoder_input_ids=torch.tensor([prompts[1] + [70]])).logits[0, -1]]
    # fp32 over 2 layers, attention reductions in another order (padded batched or paged vs per-sequence)
    torch.testing.assert_close(got, torch.stack(want), atol=1e-4, rtol=1e-4)


def test_a_tokenizer_of_another_layout_is_refused_naming_the_tokens(tmp_path) -> None:
    from runtime.models.whisper.tokens import WhisperTokens, check_tokenizer
    from runtime.text.tokenizer import tokenizer_from_dir
    ref.write_tokenizer(tmp_path / "ok")
    check_tokenizer(WhisperTokens.of(DIMS), tokenizer_from_dir(tmp_path / "ok"))
    ref.write_tokenizer(tmp_path / "v2", num_languages=99)       # large-v2's 99 languages: every id after them moves
    with pytest.raises(ValueError, match=r"<\|transcribe\|> is 358, the model.s layout says 359"):
        check_tokenizer(WhisperTokens.of(DIMS), tokenizer_from_dir(tmp_path / "v2"))
