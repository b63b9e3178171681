"""A /v1/realtime session's conversation: its items in order, what each looks like on the wire, and the
turns a response's prompt is built from.

Items (OpenAI's Realtime shapes):
  message               user audio (an utterance the session heard, or a client's `input_audio` part, which the
                        session hears as it hears a committed buffer: its encoder rows, no transcript),
                        user or system text (`input_text`), an assistant answer (`text`, or `audio` with
                        its transcript; its length in ms, which `conversation.item.truncate` may cut)
  function_call         a call the model made (`call_id`, `name`, `arguments`)
  function_call_output  the application's answer to a call (`call_id`, `output`)
Every response reads the whole conversation: the session's instructions as the system turn, then each
item as a turn; calls and their outputs the Hermes way (runtime/entrypoints/http/tools.py: a call is an
assistant `<tool_call>` block, an output a user `<tool_response>` turn). Truncating an assistant's audio
drops its transcript, as OpenAI's server does, so the model is not told what the user never heard.
A conversation holds at most the graph's `max_conversation_items` items (runtime/entrypoints/http/limits.py);
a longer one is refused item by item (400).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import torch

from runtime.entrypoints.http.audio_decode import pcm16_bytes
from runtime.entrypoints.http.errors import ApiError
from runtime.entrypoints.http.tools import call_block, tool_response

ROLES = ("user", "assistant", "system")


def item_id() -> str:
    return f"item_{uuid.uuid4().hex[:20]}"


@dataclass
class Item:
    id: str
    type: str = "message"            # "message" | "function_call" | "function_call_output"
    role: str = ""                   # a message's
    content: str = "input_text"      # a message's part: "input_text", "input_audio", "text" or "audio"
    text: str = ""                   # the text, an answer's text or transcript
    rows: torch.Tensor | None = None  # a heard utterance's encoder rows (T, D)
    audio_ms: float = 0.0            # an audio answer's length
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
    status: str = "completed"        # "in_progress" while answering, "incomplete" when cut short
    pcm: bytes = b""                 # a client's input_audio part (pcm16, 24 kHz) until the session hears it

    def wire(self) -> dict[str, Any]:
        """The item as the protocol's events carry it."""
        head = {"id": self.id, "object": "realtime.item", "type": self.type}
        if self.type == "function_call":
            return {**head, "status": self.status, "call_id": self.call_id, "name": self.name,
                    "arguments": self.arguments}
        if self.type == "function_call_output":
            return {**head, "call_id": self.call_id, "output": self.output}
        part: dict[str, Any] = {"type": self.content}
        if self.content in ("input_audio", "audio"):
            part["transcript"] = self.text or None
        else:
            part["text"] = self.text
        return {**head, "status": self.status, "role": self.role, "content": [part]}

    def turn(self) -> tuple[str, str | torch.Tensor]:
        """(role, text or rows) of the item in a response's prompt."""
        if self.type == "function_call":
            return "assistant", call_block(self.name, self.arguments)
        if self.type == "function_call_output":
            return "user", tool_response(self.output)
        return self.role, self.rows if self.rows is not None else self.text


class Conversation:
    """The items of one session, in order."""

    def __init__(self, max_items: int) -> None:
        self.items: list[Item] = []
        self.max_items = max_items

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert `item` after `previous_item_id` (after the last item when None, first for "root");
        the id of the item it follows (None: it is first)."""
        if len(self.items) >= self.max_items:
            raise ApiError(400, f"the conversation holds {self.max_items} items, this model's limit (param "
                                f"max_conversation_items); delete some first",
                           "item", "conversation_full")
        if any(i.id == item.id for i in self.items):
            raise ApiError(400, f"an item with id '{item.id}' is in the conversation already", "item.id")
        if previous_item_id is None:
            at = len(self.items)
        elif previous_item_id == "root":
            at = 0
        else:
            at = self._index(previous_item_id, "previous_item_id") + 1
        self.items.insert(at, item)
        return self.items[at - 1].id if at else None

    def delete(self, item_id: str) -> None:
        del self.items[self._index(item_id, "item_id")]

    def find(self, item_id: str, param: str = "item_id") -> Item:
        return self.items[self._index(item_id, param)]

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        """Cut an assistant's audio answer at `audio_end_ms`: its transcript goes (module docstring)."""
        item = self.find(item_id)
        if item.type != "message" or item.role != "assistant" or item.content != "audio":
            raise ApiError(400, f"item '{item_id}' is no assistant audio answer: only those can be truncated",
                           "item_id", "invalid_item")
        if content_index != 0:
            raise ApiError(400, f"content_index must be 0 (the answer's one part), got {content_index}",
                           "content_index")
        if not 0 <= audio_end_ms <= item.audio_ms:
            raise ApiError(400, f"audio_end_ms must be in [0, {item.audio_ms:.0f}] (the answer's length), "
                                f"got {audio_end_ms}", "audio_end_ms")
        item.text, item.audio_ms = "", float(audio_end_ms)

    def turns(self) -> list[tuple[str, str | torch.Tensor]]:
        """The items as prompt turns, a call joined to the assistant turn before it."""
        turns: list[tuple[str, str | torch.Tensor]] = []
        for item in self.items:
            role, content = item.turn()
            if item.type == "function_call" and turns and turns[-1][0] == "assistant" \
                    and isinstance(turns[-1][1], str):
                turns[-1] = ("assistant", f"{turns[-1][1]}\n{content}".lstrip("\n"))
            else:
                turns.append((role, content))
        return turns

    def _index(self, item_id: Any, param: str) -> int:
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise ApiError(400, f"no item '{item_id}' in the conversation", param, "item_not_found")


def client_item(value: Any) -> Item:
    """An item a client creates (`conversation.item.create`'s `item`), checked; ApiError naming the field."""
    if not isinstance(value, dict):
        raise ApiError(400, "'item' must be an object", "item")
    kind = value.get("type", "message")
    given_id = value.get("id")
    if given_id is not None and (not isinstance(given_id, str) or not given_id or len(given_id) > 64):
        raise ApiError(400, "item.id must be a non-empty string of at most 64 characters", "item.id")
    new_id = given_id or item_id()
    if kind == "function_call_output":
        call_id, output = value.get("call_id"), value.get("output")
        if not isinstance(call_id, str) or not isinstance(output, str):
            raise ApiError(400, "a function_call_output item needs string 'call_id' and 'output'", "item")
        return Item(new_id, "function_call_output", call_id=call_id, output=output)
    if kind == "function_call":
        fields = [value.get(k) for k in ("call_id", "name", "arguments")]
        if not all(isinstance(f, str) for f in fields):
            raise ApiError(400, "a function_call item needs string 'call_id', 'name' and 'arguments'", "item")
        return Item(new_id, "function_call", call_id=fields[0], name=fields[1], arguments=fields[2])
    if kind != "message":
        raise ApiError(400, f"item.type must be 'message', 'function_call' or 'function_call_output', got {kind!r}",
                       "item.type")
    role = value.get("role")
    if role not in ROLES:
        raise ApiError(400, f"item.role must be one of {', '.join(ROLES)}, got {role!r}", "item.role")
    content = value.get("content")
    if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict):
        raise ApiError(400, "item.content must be an array of one part", "item.content")
    part = content[0]
    want = "text" if role == "assistant" else "input_text"
    if part.get("type") == "input_audio" and role == "user":
        return Item(new_id, "message", role, "input_audio", pcm=pcm16_bytes(part.get("audio"), "item.content[0].audio"))
    if part.get("type") != want or not isinstance(part.get("text"), str):
        raise ApiError(400, f"a {role} item's part must be {{\"type\": \"{want}\", \"text\": ...}}",
                       "item.content[0]")
    return Item(new_id, "message", role, want, part["text"])
