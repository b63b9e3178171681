"""snac_decoder against the `snac` package's own model, and its streaming contract.

The reference is `snac.SNAC` built with the same (tiny) config and the same weights.
"""
from __future__ import annotations

import torch

from runtime.models.orpheus.codes import codes_to_tokens, tokens_to_codes
from runtime.streams.chunk_policy import Chunk, Sliding, StreamBuffer
from tests.runtime.models.orpheus.snac_reference import CODEBOOK, OFFSET, make_decoder, random_levels, reference_snac

SPF = 2048  # samples per frame, tiny preset as 24 kHz


def stream_chunks(ids: list[int]) -> list[Chunk]:
    """The chunks the Orpheus edge (sliding 28 / 7) releases for one finished utterance."""
    buf: StreamBuffer = StreamBuffer(Sliding(28, 7))
    chunks = []
    for i, token in enumerate(ids):
        buf.push(token)
        if i == len(ids) - 1:
            buf.finish()
        while (chunk := buf.take()) is not None:
            chunks.append(chunk)
    return chunks


def decode_stream(decoder, ids: list[int]) -> torch.Tensor:
    out = [decoder.decode_chunks([torch.tensor(c.items, dtype=torch.long)], [c.start], [c.num_context],
                                 [c.is_final])[0] for c in stream_chunks(ids)]
    return torch.cat(out)


def test_decode_equals_snac_without_noise():
    decoder = make_decoder()
    ref = reference_snac(decoder, silent_noise=True)
    levels = random_levels(6, batch=2)
    with torch.no_grad():
        ours, theirs = decoder.decode_codes(levels), ref.decode(levels)[:, 0]
    assert ours.shape == (2, 6 * SPF)
    # the snac package's own modules on the same codes: measured exact; a convolution kernel may block the frames
    # otherwise on another CPU, a few fp32 ulps (eps 1.2e-7) of samples |x| <= 0.43
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_decode_equals_snac_with_its_noise():
    decoder = make_decoder(noise=True)
    ref = reference_snac(decoder, silent_noise=False)
    levels = random_levels(4)
    with torch.no_grad():
        torch.manual_seed(5)
        ours = decoder.decode_codes(levels)
        torch.manual_seed(5)
        theirs = ref.decode(levels)[:, 0]
        torch.manual_seed(6)
        other = ref.decode(levels)[:, 0]
    # as above, with the same noise draw: measured exact, a few fp32 ulps allowed
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert (other - theirs).abs().max() > 1e-4  # the noise is real: a different draw differs


def orpheus_stream(ref, ids: list[int]) -> torch.Tensor:
    """Orpheus's streaming loop restated: every 7th token past 27, decode the last 28, keep [2048:4096]."""
    out, buffer = [], []
    for token in ids:
        buffer.append(token)
        if len(buffer) % 7 == 0 and len(buffer) > 27:
            levels, valid = tokens_to_codes(torch.tensor([buffer[-28:]]), OFFSET, CODEBOOK)
            assert valid.all()
            with torch.no_grad():
                out.append(ref.decode(levels)[0, 0, 2048:4096])
    return torch.cat(out)


def test_stream_without_edges_is_orpheus_exactly():
    decoder = make_decoder(keep_edges=False)
    ref = reference_snac(decoder, silent_noise=True)
    ids = codes_to_tokens(random_levels(9), OFFSET, CODEBOOK)[0].tolist() + [128258]  # + end of speech
    ours = decode_stream(decoder, ids)
    assert ours.shape == (6 * SPF,)  # frames 1..6 of 9: Orpheus drops frame 0 and the 2 tail frames
    # the same windows through the same modules: measured exact, a few fp32 ulps (eps 1.2e-7) allowed as above
    torch.testing.assert_close(ours, orpheus_stream(ref, ids), rtol=1e-5, atol=1e-6)


def test_stream_with_edges_tracks_the_full_decode():
    """Sliding-window decode vs one decode of the whole utterance.

    With keep_edges every complete frame is emitted once, so the stitched stream has the
    full decode's length. It is not equal: each frame is decoded inside a 4-frame window
    (1 frame of left context, 2 of right), shorter than the decoder's receptive field,
    and the window's zero padding replaces the true neighbours. Frames that touch the
    utterance's own edges see the same padding in both decodes and agree tightly; the
    interior frames differ by ~0.1-0.2% (relative L2) with these random weights.
    """
    decoder = make_decoder()
    levels = random_levels(10)
    ids = codes_to_tokens(levels, OFFSET, CODEBOOK)[0].tolist()
    streamed = decode_stream(decoder, ids)
    with torch.no_grad():
        full = decoder.decode_codes(levels)[0]
    assert streamed.shape == full.shape
    per_frame = (streamed - full).view(10, SPF).norm(dim=1) / full.view(10, SPF).norm(dim=1)
    # interior frames: the window's padding for the true neighbours (above), not rounding; measured max 1.6e-3
    assert per_frame.max() < 1e-2, per_frame
    # edge frames see the same padding in both: fp32 order differences only; measured 8.5e-8
    assert per_frame[0] < 1e-5 and per_frame[-1] < 1e-5, per_frame


def test_short_utterance_and_empty_final_chunk():
    decoder = make_decoder()
    ids = codes_to_tokens(random_levels(2), OFFSET, CODEBOOK)[0].tolist()  # 14 tokens: under one window
    with torch.no_grad():
        full = decoder.decode_codes(random_levels(2))[0]
    assert torch.equal(decode_stream(decoder, ids), full)
    assert decode_stream(make_decoder(keep_edges=False), ids).numel() == 0  # Orpheus: no audio at all
    empty = decoder.decode_chunks([torch.zeros(0, dtype=torch.long)], [35], [0], [True])
    assert empty[0].numel() == 0


def test_batched_chunks_equal_one_at_a_time():
    """Requests at different stream positions (first window, steady state, flush) in one call."""
    decoder = make_decoder()
    streams = [codes_to_tokens(random_levels(n, seed=n), OFFSET, CODEBOOK)[0].tolist() for n in (5, 8, 6)]
    streams[2] = streams[2] + streams[2][:3]  # a trailing partial frame
    per_request = [stream_chunks(ids) for ids in streams]
    for step in range(max(len(c) for c in per_request)):
        ready = [c[step] for c in per_request if step < len(c)]
        args = ([torch.tensor(c.items, dtype=torch.long) for c in ready], [c.start for c in ready],
                [c.num_context for c in ready], [c.is_final for c in ready])
        together = decoder.decode_chunks(*args)
        alone = [decoder.decode_chunks(*([a[i]] for a in args))[0] for i in range(len(ready))]
        for x, y in zip(together, alone):
            assert x.shape == y.shape
            # convolutions over a batch of up to 3 windows against one: other blockings, a few fp32 ulps (eps
            # 1.2e-7) of samples |x| <= 0.36; measured max 1.2e-7, 3% of the bound
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
