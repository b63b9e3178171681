"""/v1/realtime with server VAD on a real Qwen3-Omni tiny server: the graph's `silero_vad` node (the
published Silero weights) hears real speech (espeak-ng) and the server makes the turns itself.

Audio goes in as fast as the socket takes it (the detector works in audio time: window k is the
session's audio from k * 32 ms), so every `audio_start_ms` / `audio_end_ms` checked is a position in
the audio sent, known from what was sent, never a wall-clock reading.
"""
from __future__ import annotations

import numpy as np
import torch

from runtime.models.qwen3_omni.mel_featuriser import PCM_RATE
from tests.runtime.models.silero_vad.test_silero_vad import needs_espeak, spoken
from tests.runtime.serving.speech.test_omni_realtime import Client, session

WINDOW_MS = 32                   # the detector's window: 512 samples at 16 kHz
VAD = {"type": "server_vad"}
JUDGED, TURNS = "mstar_realtime_vad_windows_total", 'mstar_realtime_turns_total{by="%s"}'     # OpenAI's defaults: threshold 0.5, prefix_padding_ms 300, silence_duration_ms 500


def pcm16(wave: torch.Tensor) -> bytes:
    return (wave.clamp(-1, 1) * 32767).numpy().astype("<i2").tobytes()


def silence(seconds: float) -> bytes:
    return bytes(2 * int(PCM_RATE * seconds))


def noise(seconds: float, level: float = 0.05) -> bytes:
    rng = np.random.default_rng(7)
    return pcm16(torch.from_numpy((level * rng.standard_normal(int(PCM_RATE * seconds))).astype(np.float32)))


def ms(pcm: bytes) -> float:
    return len(pcm) / 2 / PCM_RATE * 1000


async def _vad_session(client: Client, **settings) -> None:
    await client.send("session.update", session={"turn_detection": {**VAD, **settings},
                                                 "max_response_output_tokens": 4})
    updated = await client.until("session.updated")
    assert updated[-1]["session"]["turn_detection"] == {
        "type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500,
        "create_response": True, "interrupt_response": True, **settings}


@needs_espeak
def test_speech_then_silence_is_committed_and_answered_without_a_commit_and_noise_never_starts_a_turn(omni_single):
    lead = noise(1.5) + silence(0.5) + noise(1.0, level=0.02)    # noise and silence alone: no turn
    speech = pcm16(spoken("Hello there. What is the weather like today?", PCM_RATE))

    async def body(client: Client) -> list[dict]:
        await _vad_session(client)
        await client.speak(lead + speech + silence(1.2))
        return await client.until("response.done")

    judged, turns = omni_single.metric(JUDGED), omni_single.metric(TURNS % "server_vad")
    events = session(omni_single, body)
    # the server's own count: every window up to the speech's end was judged, and one turn was made of them
    assert omni_single.metric(JUDGED) - judged >= (ms(lead) + ms(speech)) // WINDOW_MS
    assert omni_single.metric(TURNS % "server_vad") - turns == 1
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.commit" not in kinds
    assert kinds[0] == "input_audio_buffer.speech_started", f"noise or silence started a turn: {kinds[:3]}"
    started, stopped = events[0], events[kinds.index("input_audio_buffer.speech_stopped")]
    # the turn starts in the speech (espeak leads with a few ms of silence), less the 300 ms of padding
    assert ms(lead) - 300 - WINDOW_MS <= started["audio_start_ms"] <= ms(lead) + 300
    assert ms(lead) + ms(speech) - 600 <= stopped["audio_end_ms"] <= ms(lead) + ms(speech) + WINDOW_MS
    committed = events[kinds.index("input_audio_buffer.committed")]
    created = events[kinds.index("conversation.item.created")]
    assert started["item_id"] == stopped["item_id"] == committed["item_id"] == created["item"]["id"]
    assert created["item"]["content"][0]["type"] == "input_audio"
    assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("input_audio_buffer.committed") \
        < kinds.index("response.created")
    assert events[-1]["response"]["status"] == "completed"
    assert kinds.count("input_audio_buffer.speech_started") == 1


@needs_espeak
def test_speech_over_an_answer_cancels_it_and_is_the_next_turn(omni_single):
    speech = pcm16(spoken("Tell me a long story about the sea.", PCM_RATE))

    async def body(client: Client) -> list[dict]:
        await client.send("session.update", session={"turn_detection": VAD, "max_response_output_tokens": 2000})
        await client.until("session.updated")
        await client.speak(speech + silence(0.8))
        await client.until("response.audio_transcript.delta")      # the first answer is speaking
        await client.speak(speech + silence(0.8))                  # the user talks over it
        return await client.until("response.created")             # the second turn's answer

    events = session(omni_single, body)
    kinds = [e["type"] for e in events]
    barge = kinds.index("input_audio_buffer.speech_started")
    done = events[kinds.index("response.done")]
    assert done["response"]["status"] == "cancelled" and barge < kinds.index("response.done")
    assert kinds.index("response.done") < kinds.index("input_audio_buffer.speech_stopped") \
        < kinds.index("input_audio_buffer.committed") < kinds.index("response.created")
    assert events[barge]["audio_start_ms"] >= ms(speech)      # in the second utterance's audio


def test_turn_detection_settings_are_checked_and_the_session_goes_on(omni_single):
    async def body(client: Client) -> list[dict]:
        errors = []
        for bad in ({"type": "semantic_vad"}, {**VAD, "threshold": 1.5}, {**VAD, "silence_ms": 10}):
            await client.send("session.update", session={"turn_detection": bad})
            errors.append((await client.until("error"))[-1]["error"])
        await client.send("session.update", session={"turn_detection": {**VAD, "threshold": 0.6}})
        await client.until("session.updated")
        await client.send("session.update", session={"turn_detection": None})
        errors.append((await client.until("session.updated"))[-1]["session"])
        return errors

    semantic, threshold, unknown, off = session(omni_single, body)
    assert semantic["param"] == "session.turn_detection.type" and "semantic VAD is not served" in semantic["message"]
    assert threshold["param"] == "session.turn_detection.threshold" and "from 0 to 1" in threshold["message"]
    assert unknown["param"] == "session.turn_detection" and "no other field" in unknown["message"]
    assert off["turn_detection"] is None
