"""Audio bytes for clients: 16-bit PCM and WAV headers (whole and streamed)."""
from __future__ import annotations

import io
import struct
import wave

import torch

from runtime.models.orpheus.serving import OrpheusSpeaker
from runtime.models.qwen3_omni.serving import OmniSpeaker
from runtime.entrypoints.http.audio_io import pcm16, wav, wav_header


def test_pcm16_rounds_and_clamps() -> None:
    samples = torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, 1e-6])
    ints = struct.unpack("<8h", pcm16(samples))
    assert ints == (0, 16384, -16384, 32767, -32767, 32767, -32767, 0)


def test_a_whole_wav_reads_back_with_the_wave_module() -> None:
    pcm = pcm16(torch.linspace(-1, 1, 480))
    with wave.open(io.BytesIO(wav(pcm, 24000))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 24000, 480)
        assert w.readframes(480) == pcm


def test_a_streamed_wav_header_has_unknown_sizes() -> None:
    header = wav_header(24000)
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", header[4:8])[0] == struct.unpack("<I", header[40:44])[0] == 0xFFFFFFFF
    assert header[:40] == wav_header(24000, 0)[:4] + header[4:8] + wav_header(24000, 0)[8:40]


def test_voices_take_the_models_names_and_openais() -> None:
    orpheus_voice, omni_speaker = OrpheusSpeaker().voice, OmniSpeaker().voice
    assert orpheus_voice("Tara") == "tara" and orpheus_voice("alloy") == "tara" and orpheus_voice("x") is None
    assert omni_speaker("ETHAN") == "ethan" and omni_speaker("fable") == "aiden" and omni_speaker("tara") is None
