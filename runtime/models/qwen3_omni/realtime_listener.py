"""How Qwen3-Omni hears a realtime session (/v1/realtime, runtime/entrypoints/http/realtime_session.py).

The graph declares the session's audio as a client-fed streaming edge into the encoder
(graphs/qwen3_omni.yaml: `user_audio: {from: client.mel, to: audio_enc.mel, policy: {fixed: <window>}}`)
and a task whose track runs the encoder per chunk of it (`listen`). When the user starts speaking
the session opens that task's request; each append's new log-mel frames (`MelFeaturiser`,
runtime/models/qwen3_omni/mel_featuriser.py) are pushed into the stream, and the encoder runs on
every window its policy releases, its rows coming back as the walk emits them. The commit closes
the stream: the tail is the final chunk. The answer is then the plan's `voice_chat` (or `chat`)
over a ChatML prompt whose user turn is the audio placeholder, the `read_audio` walk's encoder
passing the rows already computed on to the thinker (`audio_input: "rows"`), so the thinker sees
what a whole-file `input_audio` part gives it. A conversation's prompt goes in two items whatever its
length: everything up to its last utterance (text ids and every utterance's rows at their placeholders:
one encoder Run passing the rows on, one thinker Run that the prefix cache serves up to the new turn),
then the rest; so a turn's Runs do not grow with the turns before it.
"""
from __future__ import annotations

from typing import Any

import torch

from mstar_compiler.plan import Plan
from runtime.entrypoints.http.errors import ApiError
from runtime.conductor.request import MediaInput
from runtime.models.qwen3_omni.mel_featuriser import MelFeaturiser
from runtime.models.qwen3_omni.chat_inputs import AUDIO_MARKER, OmniChatInputs, omni_chat_inputs


class OmniListener:
    """The family's side of a realtime session: the stream and task that hear it, prompt items out."""

    def __init__(self, plan: Plan, inputs: OmniChatInputs, stream: str, task: str) -> None:
        audio = next(n for n in plan.nodes if n.kind == "qwen3_omni_audio_encoder")
        self.listen_task, self.stream_name = task, stream
        self.rows_key = f"{audio.name}.hidden"                    # the rows the listen task's walk emits
        self.num_mel_bins = int(audio.dims["num_mel_bins"])
        self.max_seconds = inputs.max_audio_seconds
        self.inputs = inputs

    def features(self) -> MelFeaturiser:
        return MelFeaturiser(self.num_mel_bins, self.inputs.sample_rate)

    def feature_items(self, frames: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """The client-fed stream's items of new log-mel frames (bins, n): one frame each."""
        return [{"value": f} for f in frames.unbind(dim=1)]

    def answer_items(self, tokenizer: Any, turns: list[tuple[str, str | torch.Tensor]],
                     instructions: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
        """(input items, family params) of the answer to a conversation: `turns` in order, each a role
        ("user", "assistant", "system") and its text or the rows (T, D) of an utterance encoded as it
        streamed in; `instructions` the system prompt. The ChatML prompt is the chat endpoint's, each
        utterance in the place of an audio part, so a chat request with the same turns (the audio as
        files) reads the same prompt."""
        system = [{"role": "system", "content": instructions}] if instructions else []
        messages = system + [{"role": role, "content": AUDIO_MARKER if isinstance(content, torch.Tensor) else content}
                             for role, content in turns]
        ids = self.inputs._prompt_ids(messages, tokenizer, [])
        pad = self.inputs.ids["audio_token_id"]
        heard = [content for _, content in turns if isinstance(content, torch.Tensor)]
        at = [i for i, t in enumerate(ids) if t == pad]
        if len(at) != len(heard):
            raise ApiError(400, f"the conversation's text holds the audio placeholder token: {len(at)} "
                                f"placeholders for {len(heard)} utterances", "item.content")
        if not at:
            items: list[tuple[str, Any]] = [("text", ids)]
        else:       # the history up to the last utterance in one Run (its rows at its placeholders), the rest
            tokens = [t for start, end, rows in zip([-1] + at, at, heard)
                      for t in ids[start + 1:end] + [pad] * len(rows)]
            parts = tuple(len(rows) for rows in heard)       # each utterance named alone: a turn reuses the last's
            items = [("audio", MediaInput(torch.cat(heard), tokens, parts=parts)), ("text", ids[at[-1] + 1:])]
        return items, {"audio_input": "rows", **self.inputs.request_params(items)}


def omni_listener(plan: Plan) -> OmniListener | None:
    """A listener for plans with the chat inputs, a client-fed stream into the audio encoder and
    a task that runs the encoder per chunk of it."""
    inputs = omni_chat_inputs(plan)
    audio = next((n.name for n in plan.nodes if n.kind == "qwen3_omni_audio_encoder"), None)
    stream = next((s.name for s in plan.streams if s.is_client_fed and s.dst_node == audio), None)
    task = next((t.name for t in plan.tasks if any(tr.per_chunk == stream for tr in t.tracks)), None)
    if inputs is None or stream is None or task is None:
        return None
    return OmniListener(plan, inputs, stream, task)
