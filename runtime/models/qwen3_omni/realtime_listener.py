"""How Qwen3-Omni hears a realtime session (/v1/realtime, runtime/server/realtime_session.py).

While the user speaks, each complete audio-encoder window (runtime/models/qwen3_omni/audio_stream.py)
runs the graph's `hear` task: the `audio_enc` node on that window's log-mel frames (family param
`audio_input: "mel"`), its rows returned. At the commit the tail window runs the same way; the
answer is then the plan's `voice_chat` (or `chat`) over a ChatML prompt whose user turn is the
audio placeholder, the `read_audio` walk's encoder passing the rows already computed on to the
thinker (`audio_input: "rows"`), so the thinker sees what a whole-file `input_audio` part gives it.
"""
from __future__ import annotations

from typing import Any

import torch

from mstar_compiler.plan import Plan
from runtime.conductor.request import MediaInput
from runtime.models.qwen3_omni.audio_stream import AudioStream
from runtime.models.qwen3_omni.chat_inputs import AUDIO_MARKER, OmniChatInputs, omni_chat_inputs

HEAR_TASK = "hear"


class OmniListener:
    """The family's side of a realtime session: windows in, prompt items out."""

    hear_task = HEAR_TASK

    def __init__(self, plan: Plan, inputs: OmniChatInputs) -> None:
        audio = next(n for n in plan.nodes if n.kind == "qwen3_omni_audio_encoder")
        self.rows_key = f"{audio.name}.hidden"                    # the hear task's returned tensor
        self.num_mel_bins, self.window_frames = int(audio.dims["num_mel_bins"]), int(audio.dims["n_window_infer"])
        self.max_seconds = inputs.max_audio_seconds
        self.inputs = inputs

    def stream(self) -> AudioStream:
        return AudioStream(self.num_mel_bins, self.window_frames, self.inputs.sample_rate)

    def hear_items(self, window: torch.Tensor) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
        """(input items, family params) of the `hear` request of one mel window (bins, F)."""
        return [("audio", MediaInput(window, []))], {"audio_input": "mel"}

    def answer_items(self, tokenizer: Any, rows: torch.Tensor,
                     instructions: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
        """(input items, family params) of the answer to an utterance encoded as `rows` (T, D)."""
        messages = ([{"role": "system", "content": instructions}] if instructions else []) + \
            [{"role": "user", "content": AUDIO_MARKER}]
        ids = self.inputs._prompt_ids(messages, tokenizer, [])
        pad = self.inputs.ids["audio_token_id"]
        at = ids.index(pad)
        items: list[tuple[str, Any]] = [("text", ids[:at]), ("audio", MediaInput(rows, [pad] * rows.shape[0])),
                                        ("text", ids[at + 1:])]
        return items, {"audio_input": "rows", **self.inputs.request_params(items)}


def omni_listener(plan: Plan) -> OmniListener | None:
    """A listener for plans with the audio encoder, a talker and the `hear` task."""
    inputs = omni_chat_inputs(plan)
    if inputs is None or HEAR_TASK not in {t.name for t in plan.tasks}:
        return None
    return OmniListener(plan, inputs)
