"""Chat templates: a checkpoint's Jinja2 template turning messages into one prompt string.

Rendered the way transformers' `apply_chat_template` renders them, so a prompt built here
is byte-identical to the one the model was trained and evaluated with: an immutable
sandboxed environment (templates come from model hubs: untrusted code), `trim_blocks`
and `lstrip_blocks`, the loop-controls extension, and the helpers templates expect
(`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text).
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template is broken or refused the conversation (the request's fault: HTTP 400)."""


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which changes the prompt text
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. `source` is the Jinja2 text from the checkpoint."""

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc} (line {exc.lineno})") from exc

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None, **variables: Any) -> str:
        """The prompt text for `messages`; `variables` (bos_token, ...) are visible to the template.

        Keys whose value is None are dropped from each message first, as transformers does
        (OpenAI clients send `content: null`, `tool_calls: null`).
        """
        cleaned = [_without_none(m) for m in messages]
        try:
            return self._template.render(messages=cleaned, add_generation_prompt=add_generation_prompt,
                                         tools=tools, documents=documents, **variables)
        except (jinja2.TemplateError, TypeError) as exc:
            raise ChatTemplateError(f"chat template failed on these messages: {exc}") from exc


def _without_none(message: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ChatTemplateError(f"each message must be an object with 'role' and 'content', got {message!r}")
    return {k: v for k, v in message.items() if v is not None}
