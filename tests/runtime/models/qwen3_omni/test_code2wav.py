"""qwen3_omni_code2wav against transformers' Qwen3OmniMoeCode2Wav, and its streaming decode."""
from __future__ import annotations

import pytest
import torch

from tests.runtime.models.qwen3_omni.omni_reference import (checkpoint_tensors, close_to_largest, code2wav_config,
                                                            hf_model, preset, randomize)
from runtime.model_executor.components import component_class

KIND = "qwen3_omni_code2wav"


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    dims = preset(KIND)
    reference = hf_model.Qwen3OmniMoeCode2Wav(code2wav_config(dims)).eval()
    randomize(reference)
    ours = component_class(KIND)(dims, {}).eval()
    ours.load_hf_state_dict(checkpoint_tensors(reference))
    return reference, ours


def _codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    dims = preset(KIND)
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, dims["codebook_size"], (batch, dims["num_quantizers"], frames), generator=generator)


@torch.no_grad()
def test_full_decode_matches_transformers(pair):
    reference, ours = pair
    codes = _codes(2, 60, seed=1)  # longer than the tiny sliding window
    expected = reference(codes).squeeze(1)
    got = ours(codes)
    assert got.shape == expected.shape == (2, 1920 * 60 - 555)
    assert ours.num_samples(60) == expected.shape[-1]
    # not a saturated (clamped to [-1, 1]) signal: the comparison must be able to fail (measured: every sample under
    # 0.99, std 0.15)
    assert (expected.abs() < 0.99).float().mean() > 0.5 and expected.std() > 1e-3
    assert close_to_largest(got, expected)


@torch.no_grad()
def test_streamed_chunks_reproduce_the_full_decode(pair):
    """left_context(chunk 25, context 25): the concatenated new samples equal the full decode."""
    _, ours = pair
    codes = _codes(1, 80, seed=2)[0].T  # (F, Q)
    full = ours(codes.T[None])[0]
    pieces, start = [], 0
    while start < codes.shape[0]:
        end, context = min(start + 25, codes.shape[0]), min(25, start)
        pieces += ours.decode_chunks([codes[start - context: end]], [context])
        start = end
    streamed = torch.cat(pieces)
    assert streamed.shape == full.shape
    assert close_to_largest(streamed, full)
    # the left context is what makes this work: without it a chunk's first samples differ
    alone = ours.decode_chunks([codes[25:50]], [0])[0]
    # without its context a chunk's first samples are off by 78% of the largest one (measured): 1e-2 is far below
    # that and far above any rounding (1e-6 above)
    assert not close_to_largest(alone[:2000], full[1920 * 25: 1920 * 25 + 2000], rtol=1e-2)


@torch.no_grad()
def test_chunk_batch_equals_members_one_at_a_time(pair):
    """Requests with different chunk and context lengths share one padded batch."""
    _, ours = pair
    chunks = [_codes(1, n, seed=n)[0].T for n in (50, 30, 7, 10)]
    contexts = [25, 5, 0, 10]  # the last: a final release with context only
    together = ours.decode_chunks(chunks, contexts)
    for chunk, context, got in zip(chunks, contexts, together):
        alone = ours.decode_chunks([chunk], [context])[0]
        assert got.shape == alone.shape == (ours.num_samples(chunk.shape[0]) - ours.num_samples(context),)
        # one padded batch against each alone: other blockings in the convolutions, fp32 order differences only;
        # measured at most 9.1e-7 of the largest sample
        assert got.numel() == 0 or close_to_largest(got, alone, rtol=1e-5)
    assert together[-1].numel() == 0 and ours.decode_chunks([chunks[0][:0]], [0])[0].numel() == 0


def test_rejects_wrong_number_of_codebooks(pair):
    _, ours = pair
    with pytest.raises(ValueError, match="codebooks"):
        ours(torch.zeros(1, 3, 5, dtype=torch.long))
