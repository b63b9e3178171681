"""What a plan needs to speak: its speech task, where the audio comes out, and who prompts it.

A speaking graph is recognised by its family's `Speaker` (runtime/entrypoints/http/families.py): the
vocoder kind whose audio the client hears, the model's voices and its prompts.
"""
from __future__ import annotations

from dataclasses import dataclass

from mstar_compiler.plan import Plan
from runtime.conductor.streams import track_nodes
from runtime.entrypoints.http.families import Speaker, families_of


@dataclass(frozen=True)
class SpeechModel:
    """How the served plan speaks."""

    task: str                    # the task with the audio track
    audio_key: str               # "<node>.<port>" of the audio chunks
    sample_rate: int
    speaker: Speaker             # its family's prompts and voices


def speech_model(plan: Plan) -> SpeechModel | None:
    """The plan's way of speaking, or None when it has no audio-producing task."""
    for family in families_of(plan):
        speaker = family.speaker
        vocoder = next((n for n in plan.nodes if speaker and n.kind == speaker.vocoder_kind), None)
        if vocoder is None:
            continue
        task = next((t.name for t in plan.tasks for tr in t.tracks
                     if tr.per_chunk is not None and vocoder.name in track_nodes(plan, tr)), None)
        if task is None:
            continue
        port = next(p.name for p in vocoder.outputs if p.dtype == "audio")
        return SpeechModel(task, f"{vocoder.name}.{port}", int(vocoder.dims.get("sampling_rate", 24000)), speaker)
    return None
