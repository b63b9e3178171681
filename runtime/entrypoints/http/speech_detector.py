"""The plan's voice activity detector, as a realtime session's turn detection finds it
(runtime/entrypoints/http/realtime_turns.py): a `silero_vad` node, the client-fed stream into it and
the task that runs it per chunk of that stream (graphs/qwen3_omni.yaml's `vad`, `user_pcm`, `detect_speech`)."""
from __future__ import annotations

from dataclasses import dataclass

from mstar_compiler.plan import Plan

DETECTOR_KIND = "silero_vad"


@dataclass(frozen=True)
class SpeechDetector:
    """The plan's voice activity detector: the task that runs it, its client-fed stream, the key of
    the probabilities its walk emits, and its window."""

    task: str
    stream: str
    key: str
    sample_rate: int
    window: int

    @property
    def window_ms(self) -> float:
        return 1000 * self.window / self.sample_rate


def speech_detector(plan: Plan) -> SpeechDetector | None:
    """The plan's detector: a `silero_vad` node, a client-fed stream into it, a task running it per chunk."""
    node = next((n for n in plan.nodes if n.kind == DETECTOR_KIND), None)
    stream = next((s.name for s in plan.streams if node and s.is_client_fed and s.dst_node == node.name), None)
    task = next((t.name for t in plan.tasks if any(tr.per_chunk == stream for tr in t.tracks)), None)
    if node is None or stream is None or task is None:
        return None
    return SpeechDetector(task, stream, f"{node.name}.speech", int(node.dims["sample_rate"]), int(node.dims["window"]))
