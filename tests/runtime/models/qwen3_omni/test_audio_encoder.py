"""qwen3_omni_audio_encoder against transformers' Qwen3OmniMoeAudioEncoder and WhisperFeatureExtractor."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from tests.runtime.models.qwen3_omni.omni_reference import (audio_config, checkpoint_tensors, close_to_largest,
                                                            hf_model, preset, randomize)
from runtime.model_executor.components import component_class

KIND = "qwen3_omni_audio_encoder"


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    dims = preset(KIND)
    reference = hf_model.Qwen3OmniMoeAudioEncoder(audio_config(dims)).eval()
    randomize(reference, seed=13)
    ours = component_class(KIND)(dims, {}).eval()
    ours.load_hf_state_dict(checkpoint_tensors(reference))
    return reference, ours


def _mel(frames: int, seed: int) -> torch.Tensor:
    return torch.randn(preset(KIND)["num_mel_bins"], frames, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_hidden_states_match_transformers(pair):
    """Three audios: several chunks and attention windows, a partial last chunk, one short audio."""
    reference, ours = pair
    mels = [_mel(450, 1), _mel(230, 2), _mel(60, 3)]
    expected = reference(input_features=torch.cat(mels, dim=1),
                         feature_lens=torch.tensor([m.shape[1] for m in mels])).last_hidden_state
    got = ours(mels)
    assert [g.shape[0] for g in got] == [ours.num_tokens(m.shape[1]) for m in mels] == [59, 30, 8]
    assert ours.window < got[0].shape[0]  # the first audio spans several attention windows
    assert close_to_largest(torch.cat(got), expected)


@torch.no_grad()
def test_batch_equals_members_one_at_a_time(pair):
    _, ours = pair
    mels = [_mel(450, 4), _mel(37, 5), _mel(130, 6)]
    together = ours(mels)
    for mel, got in zip(mels, together):
        # a batch of audios against one: other row counts through the GEMMs and windows, fp32 order differences
        # only; measured at most 2.0e-7 of the largest value
        assert close_to_largest(got, ours([mel])[0], rtol=1e-5)


def test_log_mel_matches_whisper_feature_extractor(pair):
    _, ours = pair
    extractor = WhisperFeatureExtractor(feature_size=ours.num_mel_bins, sampling_rate=16000)
    t = np.arange(16000 * 2 // 3) / 16000
    wave = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.random.default_rng(0).standard_normal(t.shape))
    expected = extractor(wave.astype(np.float32), sampling_rate=16000, padding="longest",
                         return_tensors="pt").input_features[0]
    got = ours.features(torch.from_numpy(wave).float())
    assert got.shape == expected.shape == (ours.num_mel_bins, len(t) // 160)
    # the STFT and mel projection against transformers' Whisper extractor (numpy) on the same samples: other op
    # orders on log-mel values of order 1, 1e-4 being ~800 fp32 eps; measured exact here
    assert (got - expected).abs().max() < 1e-4


@torch.no_grad()
def test_encode_runs_from_waveforms(pair):
    _, ours = pair
    waves = [torch.randn(16000, generator=torch.Generator().manual_seed(7)), torch.randn(4000)]
    hidden = ours.encode(waves)
    assert [h.shape for h in hidden] == [(ours.num_tokens(100), 64), (ours.num_tokens(25), 64)]
