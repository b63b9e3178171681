"""Audio bytes for clients: 16-bit PCM, WAV (whole or streamed), and voice-name lookup.

Streamed WAV starts with a header whose RIFF and data sizes are 0xFFFFFFFF (the length is
unknown while the audio is produced; players read to the end of the stream), followed by
the PCM chunks as they are decoded. A whole WAV carries the real sizes.
"""
from __future__ import annotations

import struct

import torch

FORMATS = ("wav", "pcm")        # response_format values this server writes
UNKNOWN_SIZE = 0xFFFFFFFF

def voice_for(voice: str, own: tuple[str, ...], openai_map: dict[str, str]) -> str | None:
    """The model's voice for a requested name (its own or OpenAI's), None if unknown."""
    name = voice.lower()
    return name if name in own else openai_map.get(name)


def pcm16(audio: torch.Tensor) -> bytes:
    """Float samples in [-1, 1] -> 16-bit little-endian PCM bytes."""
    ints = (audio.detach().float().clamp(-1.0, 1.0) * 32767.0).round().to(torch.int16)
    return ints.numpy().astype("<i2").tobytes()


def wav_header(sample_rate: int, num_data_bytes: int | None = None, channels: int = 1, bits: int = 16) -> bytes:
    """A 44-byte PCM WAV header; `num_data_bytes=None` writes the streaming (unknown size) form."""
    data = UNKNOWN_SIZE if num_data_bytes is None else num_data_bytes
    riff = UNKNOWN_SIZE if num_data_bytes is None else 36 + num_data_bytes
    block = channels * bits // 8
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
            + b"data" + struct.pack("<I", data))


def wav(pcm: bytes, sample_rate: int) -> bytes:
    """A whole WAV file around 16-bit mono PCM bytes."""
    return wav_header(sample_rate, len(pcm)) + pcm


def content_type(fmt: str) -> str:
    return {"wav": "audio/wav", "pcm": "audio/pcm"}[fmt]
