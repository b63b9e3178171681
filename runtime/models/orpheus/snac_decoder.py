"""snac_decoder: Orpheus audio tokens -> 24 kHz audio with SNAC's quantizer and decoder.

Built from the PyPI `snac` package's own modules (`ResidualVectorQuantize`, `Decoder`),
so parameter names are the SNAC checkpoint's (`quantizer.quantizers.0.codebook.weight`,
`decoder.model.…`); SNAC's encoder is not part of the node. The decoder's NoiseBlocks
keep their weights, but unless `args.noise` is set they add nothing: SNAC draws fresh
Gaussian noise per call, which makes a decode neither reproducible nor batch-invariant.

How the runtime drives it (see `runtime/models/orpheus/windows.py` for the kept-frame rule):
the worker holds a `StreamBuffer(Sliding(28, 7))` per request; whenever the buffer
releases chunks, it calls `decode_chunks` once for all ready requests. Regular windows
(4 frames) of all requests decode in one batch; flush windows with fewer frames are
grouped by length. Each request gets back the samples of the frames it newly emits.
"""
from __future__ import annotations

from math import prod
from typing import Any, Mapping, Sequence

import torch
from snac.layers import Decoder, NoiseBlock
from snac.vq import ResidualVectorQuantize
from torch import nn

from runtime.models.orpheus.codes import TOKENS_PER_FRAME, tokens_to_codes
from runtime.models.orpheus.windows import FrameSpan, emitted_frames


class _SilentNoise(NoiseBlock):
    """SNAC's NoiseBlock with its weights kept (checkpoint layout) and no noise added."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _silence_noise(decoder: nn.Module) -> None:
    for block in decoder.model:
        layers = getattr(block, "block", None)
        for i, layer in enumerate(layers or ()):
            if isinstance(layer, NoiseBlock):
                layers[i] = _SilentNoise(layer.linear.in_channels)


class SnacDecoder(nn.Module):
    """SNAC decode of Orpheus token windows; `forward` decodes whole frames."""
    kind = "snac_decoder"

    def __init__(self, dims: Mapping[str, Any], args: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        args = dict(args or {})
        self.offset = int(dims["audio_token_offset"])
        self.codebook_size = int(dims["codebook_size"])
        # one coarse code = vq_strides[0] latent steps of prod(decoder_rates) samples: 2048 at 24 kHz
        self.samples_per_frame = prod(dims["decoder_rates"]) * dims["vq_strides"][0]
        self.keep_edges = bool(args.get("keep_edges", True))
        self.quantizer = ResidualVectorQuantize(
            input_dim=dims["latent_dim"], codebook_size=self.codebook_size,
            codebook_dim=dims["codebook_dim"], vq_strides=list(dims["vq_strides"]))
        self.decoder = Decoder(
            dims["latent_dim"], dims["decoder_dim"], list(dims["decoder_rates"]), dims["noise"],
            depthwise=True, attn_window_size=None)
        if not args.get("noise", False):
            _silence_noise(self.decoder)

    def decode_codes(self, levels: list[torch.Tensor]) -> torch.Tensor:
        """SNAC.decode: levels (B, F), (B, 2F), (B, 4F) -> audio (B, F * samples_per_frame)."""
        audio = self.decoder(self.quantizer.from_codes(levels))  # (B, 1, S)
        return audio[:, 0]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Frame-aligned token windows (B, 7F) -> audio (B, F * samples_per_frame).

        A window holding a token that is not an audio token of its frame position
        decodes to silence (Orpheus drops such a window).
        """
        levels, valid = tokens_to_codes(tokens, self.offset, self.codebook_size)
        audio = self.decode_codes(levels)
        return audio * valid[:, None].to(audio.dtype)

    @torch.inference_mode()
    def decode_chunks(self, tokens: Sequence[torch.Tensor], starts: Sequence[int], num_context: Sequence[int],
                      is_final: Sequence[bool]) -> list[torch.Tensor]:
        """Decode one streamed chunk per request; return each request's new samples.

        tokens[i]: (L_i,) int64, the chunk's tokens (`Chunk.items`); starts[i]: stream
        index of its first token (`Chunk.start`); num_context[i]: how many of them were
        delivered before (`Chunk.num_context`); is_final[i]: `Chunk.is_final`.
        Returns (S_i,) float audio per request, S_i a multiple of samples_per_frame
        (possibly 0). Chunks are batched by their number of complete frames.
        """
        spans = [emitted_frames(s, len(t), c, f, self.keep_edges)
                 for t, s, c, f in zip(tokens, starts, num_context, is_final)]
        out = [torch.zeros(0) for _ in spans]
        groups: dict[int, list[int]] = {}
        for i, span in enumerate(spans):
            if span.hi > span.lo:
                groups.setdefault(span.num_frames, []).append(i)
        for members in groups.values():
            windows = torch.stack([_frame_tokens(tokens[i], starts[i], spans[i]) for i in members])  # (B, 7F)
            audio = self(windows.to(self.quantizer.quantizers[0].codebook.weight.device))
            for row, i in enumerate(members):
                out[i] = self._kept(audio[row], spans[i])
        return out

    def _kept(self, audio: torch.Tensor, span: FrameSpan) -> torch.Tensor:
        spf = self.samples_per_frame
        return audio[(span.lo - span.first) * spf:(span.hi - span.first) * spf]


def _frame_tokens(tokens: torch.Tensor, start: int, span: FrameSpan) -> torch.Tensor:
    """The chunk's tokens of its complete frames [span.first, span.end)."""
    lo = span.first * TOKENS_PER_FRAME - start
    return tokens[lo:lo + span.num_frames * TOKENS_PER_FRAME]
