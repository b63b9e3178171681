"""What Qwen3-Omni adds to the server: its speech prompt, speakers and audio chat
(runtime/entrypoints/http/families.py).

The prompt is a ChatML chat whose last turn is an open `<|im_start|>assistant` (the talker
needs that turn), and the talker's speaker is a request param. With seeded random weights
the server has a byte tokenizer and no chat template, so the ChatML special tokens are
written as the ids the talker preset names (`im_start_token_id`, `user_token_id`,
`assistant_token_id`).
"""
from __future__ import annotations

from typing import Any, Mapping

from runtime.models.qwen3_omni.chat_inputs import omni_chat_inputs
from runtime.models.qwen3_omni.realtime_listener import omni_listener
from runtime.entrypoints.http.audio_io import voice_for
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.families import FamilyServing, ServedModel
from runtime.text import ByteTokenizer

SPEAKERS = ("chelsie", "ethan", "aiden")
_OPENAI_VOICES = {"alloy": "chelsie", "ash": "ethan", "ballad": "aiden", "coral": "chelsie", "echo": "ethan",
                  "fable": "aiden", "onyx": "ethan", "nova": "chelsie", "sage": "chelsie", "shimmer": "chelsie",
                  "verse": "aiden"}
SYSTEM_ROLE_BYTES = b"system"


def omni_prompt(tokenizer: Any, dims: Mapping[str, Any], messages: list[dict[str, str]]) -> list[int]:
    """ChatML ids ending in an open assistant turn (module docstring)."""
    if not isinstance(tokenizer, ByteTokenizer):
        return tokenizer.encode(tokenizer.render_chat(messages, add_generation_prompt=True), add_special_tokens=False)
    role_ids = {"user": [dims["user_token_id"]], "assistant": [dims["assistant_token_id"]],
                "system": list(SYSTEM_ROLE_BYTES)}
    ids: list[int] = []
    for m in messages:
        if m["role"] not in role_ids:
            raise ApiError(400, f"unknown role '{m['role']}' (system, user, assistant)", "messages")
        ids += [dims["im_start_token_id"], *role_ids[m["role"]], *tokenizer.encode("\n" + m["content"] + "\n")]
    return ids + [dims["im_start_token_id"], dims["assistant_token_id"], *tokenizer.encode("\n")]


def talker_dims(server: ServedModel) -> Mapping[str, Any]:
    return next(n.dims for n in server.plan.nodes if n.kind == "qwen3_omni_talker")


class OmniSpeaker:
    vocoder_kind = "qwen3_omni_code2wav"
    voices = SPEAKERS
    can_chat = True

    def voice(self, name: str) -> str | None:
        return voice_for(name, SPEAKERS, _OPENAI_VOICES)

    def prompt(self, server: ServedModel, voice: str, text: str) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        return self.chat_prompt(server, voice, [{"role": "user", "content": text}])

    def chat_prompt(self, server: ServedModel, voice: str,
                    messages: list[dict[str, str]]) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        return omni_prompt(server.tokenizer, talker_dims(server), messages), {"speaker": voice}, server.stop_token_ids()


SERVING = FamilyServing(frozenset({"qwen3_omni_code2wav", "qwen3_omni_audio_encoder"}),
                        speaker=OmniSpeaker(), chat_inputs=omni_chat_inputs, realtime=omni_listener)
