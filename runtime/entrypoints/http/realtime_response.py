"""One /v1/realtime response's output as its request decodes: an assistant message, function calls, or both.

The message item joins the conversation at its first text or audio (`response.output_item.added`) and
grows with each delta (`response.text.delta`, or `response.audio.delta` and
`response.audio_transcript.delta`, each naming its `item_id`), so a response cancelled midway leaves
what the user heard in the conversation, marked "incomplete". When the session has tools, text that is
a call (a `<tool_call>` block, runtime/entrypoints/http/tools.py) becomes a `function_call` item instead:
`response.output_item.added`, `response.function_call_arguments.delta` (the arguments whole, once the
block closes) and `.done`, `response.output_item.done`; the application answers it with a
`function_call_output` item and a new `response.create`.
"""
from __future__ import annotations

import base64
from typing import Any, Awaitable, Callable

from runtime.entrypoints.http.audio_decode import PCM_RATE
from runtime.entrypoints.http.audio_events import AudioEvents
from runtime.entrypoints.http.audio_io import pcm16
from runtime.entrypoints.http.realtime_conversation import Conversation, Item, item_id
from runtime.entrypoints.http.tools import ToolCallStream, ToolUse
from runtime.model_executor.sampling import SamplingParams
from runtime.text import TextOutput


class ResponseOutput:
    """The output items of one response, written to the client and the conversation as they grow."""

    def __init__(self, send: Callable[..., Awaitable[None]], conversation: Conversation, response_id: str,
                 speaks: bool, tools: ToolUse | None) -> None:
        self.send, self.conversation, self.response_id, self.speaks = send, conversation, response_id, speaks
        self.calls = ToolCallStream(tools.names) if tools is not None and tools.read_calls else None
        self.items: list[Item] = []
        self.message: Item | None = None

    async def stream(self, events: AudioEvents, tokenizer: Any) -> None:
        """Write the request's deltas until it ends."""
        text = TextOutput(tokenizer, SamplingParams(), stop_ids=events.req.stop_token_ids)
        done = False
        while not done:
            tokens, audio, done = await events.next()
            delta, found = text.push_ids(tokens, is_last=done), []
            if self.calls is not None:
                delta, found = self.calls.push(delta)
                delta += self.calls.finish() if done else ""
            if delta:
                await self._text(delta)
            for piece in audio if self.speaks else []:
                await self._audio(piece)
                events.sent(piece)
            for call in found:
                await self._call(call["function"])
        events.observe()
        await self._finish_message()

    async def relay(self, answer: Any) -> None:
        """Write an answer made elsewhere until it ends: its `next()` gives (text delta, audio pieces, whether
        it was the last), as a cascade's (runtime/entrypoints/http/cascade.py) does."""
        done = False
        while not done:
            text, audio, done = await answer.next()
            if text:
                await self._text(text)
            for piece in audio if self.speaks else []:
                await self._audio(piece)
        await self._finish_message()

    def cut(self) -> list[dict[str, Any]]:
        """The response was cancelled: its message so far stays in the conversation, incomplete."""
        if self.message is not None and self.message.status == "in_progress":
            self.message.status = "incomplete"
        return [item.wire() for item in self.items]

    def output(self) -> list[dict[str, Any]]:
        return [item.wire() for item in self.items]

    def _ids(self, item: Item) -> dict[str, Any]:
        return {"response_id": self.response_id, "item_id": item.id, "output_index": self.items.index(item)}

    async def _added(self, item: Item) -> None:
        self.conversation.add(item)
        self.items.append(item)
        await self.send("response.output_item.added", response_id=self.response_id,
                        output_index=len(self.items) - 1, item=item.wire())

    async def _ensure_message(self) -> Item:
        if self.message is None:
            self.message = Item(item_id(), role="assistant", content="audio" if self.speaks else "text",
                                status="in_progress")
            await self._added(self.message)
        return self.message

    async def _text(self, delta: str) -> None:
        item = await self._ensure_message()
        item.text += delta
        await self.send("response.audio_transcript.delta" if self.speaks else "response.text.delta",
                        delta=delta, content_index=0, **self._ids(item))

    async def _audio(self, piece: Any) -> None:
        item = await self._ensure_message()
        item.audio_ms += 1000.0 * piece.numel() / PCM_RATE          # pcm16 at the session's 24 kHz
        await self.send("response.audio.delta", delta=base64.b64encode(pcm16(piece)).decode(), content_index=0,
                        **self._ids(item))

    async def _call(self, function: dict[str, Any]) -> None:
        item = Item(item_id(), "function_call", call_id=f"call_{item_id()[5:]}", name=function["name"],
                    arguments=function["arguments"], status="in_progress")
        await self._added(item)
        ids = {**self._ids(item), "call_id": item.call_id}
        await self.send("response.function_call_arguments.delta", delta=item.arguments, **ids)
        await self.send("response.function_call_arguments.done", name=item.name, arguments=item.arguments, **ids)
        item.status = "completed"
        await self.send("response.output_item.done", response_id=self.response_id,
                        output_index=ids["output_index"], item=item.wire())

    async def _finish_message(self) -> None:
        item = self.message
        if item is None:
            return
        ids = {**self._ids(item), "content_index": 0}
        if self.speaks:
            await self.send("response.audio.done", **ids)
            await self.send("response.audio_transcript.done", transcript=item.text, **ids)
        else:
            await self.send("response.text.done", text=item.text, **ids)
        item.status = "completed"
        await self.send("response.output_item.done", response_id=self.response_id,
                        output_index=ids["output_index"], item=item.wire())
