"""What a model family adds to the HTTP server: its `FamilyServing`, which its `Family` names.

The generic server names no family and no kind. A family whose models need more than the
generic handlers (its own endpoints, how it is prompted to speak, its voices, what the
page's playground offers) declares a `FamilyServing` (built-ins in `runtime/models/<family>/serving.py`)
and names it in its `Family` (mstar_compiler/catalogue: `Family.serving`, a "module:attr"
reference); `families_of(plan)` returns those whose kinds the plan holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from mstar_compiler.catalogue import load_families, load_ref
from mstar_compiler.plan import Plan

if TYPE_CHECKING:
    import torch
    from aiohttp import web

    from runtime.text.tokenizer import TextTokenizer


class ServedModel(Protocol):
    """What a family's prompts may read of the server (runtime/entrypoints/http/context.py's ServerContext has more)."""

    plan: Plan
    model_id: str                     # the name clients send as `model`
    tokenizer: TextTokenizer          # the chat LM's

    def stop_token_ids(self, extra: Sequence[int] = (), ignore_eos: bool = False) -> frozenset[int]:
        """The ids a request stops at: end of sequence and `extra`; none with `ignore_eos`."""


class Speaker(Protocol):
    """How a family's speaking graph is asked to speak (the generic speech endpoints call it)."""

    vocoder_kind: str                 # the node kind whose audio output the client hears
    voices: tuple[str, ...]           # the model's own voice names
    can_chat: bool                    # answers /v1/chat/completions with `modalities: [..., "audio"]`

    def voice(self, name: str) -> str | None:
        """The model's voice for a requested name (its own or one of OpenAI's), None if unknown."""

    def prompt(self, server: ServedModel, voice: str, text: str) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        """(prompt ids, values for the family's executors (`RequestParams.family`), stop ids) to speak
        `text` in `voice`."""

    def chat_prompt(self, server: ServedModel, voice: str,
                    messages: list[dict[str, str]]) -> tuple[list[int], dict[str, Any], frozenset[int]]:
        """The same for a chat answered in speech (only where `can_chat`)."""


class Listener(Protocol):
    """A family's way of hearing a /v1/realtime session (runtime/entrypoints/http/realtime_session.py)."""

    listen_task: str            # the plan task that encodes an utterance while it streams in
    stream_name: str            # its client-fed stream
    rows_key: str               # "<node>.<port>" of the rows its walk emits
    max_seconds: float          # the longest utterance (the graph's audio limit)

    def features(self) -> Any:
        """A new featuriser of one utterance's audio: `push(pcm16 bytes)` / `finish()` return new
        features; `seconds`."""

    def feature_items(self, features: Any) -> list[dict[str, torch.Tensor]]: ...

    def answer_items(self, tokenizer: Any, turns: list[tuple[str, str | torch.Tensor]],
                     instructions: str) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
        """(input items, family params) of the answer to a conversation: each turn a role and its text
        or the rows of an utterance the session heard."""


class Transcriber(Protocol):
    """A family's own answer to /v1/audio/transcriptions and /v1/audio/translations (a speech recognition
    model; without one the generic handler prompts the chat LM with the audio)."""
    can_translate: bool
    async def answer(self, request: web.Request, server: Any, data: bytes, form: Any, task: str
                     ) -> web.StreamResponse:
        """The response to one form (`task` "transcribe" or "translate"; `form` a TranscriptionForm or a
        TranslationForm of runtime/entrypoints/http/schemas.py), the audio file's bytes `data`."""


class Drawer(Protocol):
    """A family's image generation, as the generic /v1/images endpoints ask it (runtime/entrypoints/http/images.py)."""

    generate_task: str                # the plan task of a text-to-image request
    edit_task: str                    # the plan task of an edit ("": the model does not edit)
    aliases: Mapping[str, str]        # a body field's name -> the plan param it sets (`guidance_scale`, ...)
    mask_refusal: str                 # why a `mask` is refused

    def default_size(self) -> tuple[int, int]:
        """(width, height) of an image whose request does not say."""

    def size_problem(self, width: int, height: int) -> str | None:
        """Why the model cannot draw width x height, None when it can."""

    def task_defaults(self, task: str) -> Mapping[str, Any]:
        """Plan params a task takes unless the request sets them."""

    def prompt_ids(self, server: ServedModel, prompt: str) -> list[int]:
        """The prompt's token ids as the model reads them (ApiError 400 when it cannot)."""

    def check_fields(self, fields: Mapping[str, Any]) -> None:
        """ApiError 400 for a body field the model cannot honour (beyond the plan's params)."""


@dataclass(frozen=True)
class FamilyServing:
    """One family's additions to the server."""

    kinds: frozenset[str]                                   # a plan with any of these is served by it
    speaker: Speaker | None = None
    install: Callable[[web.Application], None] | None = None    # adds the family's own routes
    playground: Callable[[Plan], dict[str, Any]] | None = None  # the page's panels it can fill
    # an input image (PIL) as the family's models take it (BAGEL resizes every input image)
    prepare_image: Callable[[Plan, Any], Any] | None = None
    # the rows the family's encoders compute from a prepared (H, W, 3) image: its items then carry them
    # (runtime.conductor.request.SizedInput), so a batch of pictures stays within the scheduler's rows
    image_rows: Callable[[Plan, Any], int] | None = None
    # the reader of non-text chat parts (runtime/entrypoints/http/chat_inputs.py's ChatInputs) for a plan
    chat_inputs: Callable[[Plan], Any] | None = None
    # how a /v1/realtime session's audio is heard (None: not for this plan)
    realtime: Callable[[Plan], Listener | None] | None = None
    # its speech recognition's answer to the transcription endpoints (None: not for this plan)
    transcriber: Callable[[Plan], Transcriber | None] | None = None
    # its image generation behind the image endpoints (None: not for this plan)
    drawer: Callable[[Plan], Drawer | None] | None = None


@cache
def _servings() -> tuple[FamilyServing, ...]:
    """Every family's serving, in the order of `load_families()` (imports each serving module)."""
    found = []
    for family in load_families().values():
        if family.serving:
            serving = load_ref(family.serving)
            if not isinstance(serving, FamilyServing):
                raise TypeError(f"family {family.name!r} names {family.serving} as its serving, a "
                                f"{type(serving).__name__}, not a runtime.entrypoints.http.families.FamilyServing")
            found.append(serving)
    return tuple(found)


def families_of(plan: Plan) -> list[FamilyServing]:
    """The families' servings whose kinds the plan holds, in the order the families are declared."""
    kinds = {n.kind for n in plan.nodes}
    return [serving for serving in _servings() if serving.kinds & kinds]


def transcriber_for(plan: Plan) -> Transcriber | None:
    """The plan's family transcriber (`FamilyServing.transcriber`), None when no family of it has one."""
    for family in families_of(plan):
        if family.transcriber is not None and (found := family.transcriber(plan)) is not None:
            return found
    return None


def drawer_for(plan: Plan) -> Drawer | None:
    """The plan's family drawer (`FamilyServing.drawer`), None when no family of it draws."""
    for family in families_of(plan):
        if family.drawer is not None and (found := family.drawer(plan)) is not None:
            return found
    return None
