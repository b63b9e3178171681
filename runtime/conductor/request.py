"""A request as the conductor sees it: its state, its tracks, its values and its output.

The state is an ordered enum (vLLM v1's habit): FINISHED and everything after it is
final; every move is one of the transition methods, which refuse illegal moves.
`LEGAL_TRANSITIONS` is the whole table; a test lists it.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgspec

from mstar_compiler.plan import Count
from runtime.conductor.cursor import TrackCursor, resolve_count
from runtime.conductor.output_queue import OutputQueue
from runtime.transport.messages import TokenLogprob
from runtime.transport.request_params import RequestParams


class RequestState(enum.IntEnum):
    WAITING = 0     # accepted, queued; holds no KV blocks
    RUNNING = 1     # admitted: its tracks advance; may hold KV blocks
    PREEMPTED = 2   # its KV blocks were taken back under memory pressure; resumes by recomputing
    FINISHED = 3    # every track is done; output complete
    ABORTED = 4     # the client went away or the request timed out
    FAILED = 5      # a worker failed or died while running it, it timed out, or the server shut down

    @property
    def is_final(self) -> bool:
        return self >= RequestState.FINISHED


LEGAL_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.WAITING: frozenset({RequestState.RUNNING, RequestState.ABORTED, RequestState.FAILED}),
    RequestState.RUNNING: frozenset({RequestState.PREEMPTED, RequestState.FINISHED,
                                     RequestState.ABORTED, RequestState.FAILED}),
    RequestState.PREEMPTED: frozenset({RequestState.RUNNING, RequestState.ABORTED, RequestState.FAILED}),
    RequestState.FINISHED: frozenset(),
    RequestState.ABORTED: frozenset(),
    RequestState.FAILED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A transition the state table does not allow (a conductor bug, never a user error)."""


@dataclass(frozen=True)
class MediaInput:
    """A non-text request input item and the token ids that stand for it in an LM's context.

    The encoder's port of the item's modality reads `value`; in the same for_each state, an
    LM's `tokens` port reads `tokens` (the placeholders whose embeddings the encoder's output
    replaces), so the LM's KV cache and the conductor's count of it include those rows.
    """

    value: Any              # what the encoder reads: a tensor (a waveform, an image)
    tokens: list[int]       # placeholder ids, one per encoder output row (and any markers around them)
    # rows of `value` (its first dim, one per placeholder) that are separate media, each named alone by the
    # prefix cache (runtime/conductor/media_keys.py): a realtime conversation's utterances; (): one medium
    parts: tuple[int, ...] = field(default=(), kw_only=True)


@dataclass(frozen=True)
class SizedInput:
    """A non-text request input item whose LM reads no placeholders (its executor lays the rows out itself,
    as BAGEL's does) with the rows its encoders compute from it, which a batch's rows count
    (SchedulerConfig.max_batch_tokens)."""

    value: Any              # what the encoder reads: a tensor (an image)
    rows: int               # the most rows an encoder computes from it (BAGEL: its ViT patches)


class OutputEvent(msgspec.Struct):
    """What the conductor tells the server about a request: new tokens, tensors, or the end
    (one per row per step: a struct, built in C; empty defaults are fresh per event)."""

    token_ids: list[int] = []            # tokens produced since the last event
    tensors: dict[str, Any] = {}         # "<node>.<port>" -> torch.Tensor (final values)
    finish_reason: str | None = None     # set on the last event: stop|length|abort|error
    error: str | None = None             # message when finish_reason == "error"
    status: int = 500                    # HTTP status of the error (504 timeout, 503 shutdown)
    code: str = "worker_failed"          # OpenAI-style error code of the error
    logprobs: list[TokenLogprob] = []    # one per token id, when the request asked


@dataclass
class Request:
    """One request's whole conductor-side state."""

    request_id: int
    task: str
    params: RequestParams                  # resolved once by the server (runtime/entrypoints/http/params.py)
    input_items: list[tuple[str, Any]]     # the request's inputs in order: (dtype, value); text is tokenised
    tracks: list[TrackCursor]
    stop_token_ids: frozenset[int] = frozenset()
    state: RequestState = RequestState.WAITING
    values: dict[str, list[int]] = field(default_factory=dict)   # "<node>.<port>" -> every token id produced
                                                                 # ([] for tensor values kept on workers)
    last_values: dict[str, list[int]] = field(default_factory=dict)  # token ids of the latest step only
    kv_history: dict[str, list[int]] = field(default_factory=dict)  # KV node -> every token fed to it
    kv_fed: dict[str, int] = field(default_factory=dict)         # KV node -> tokens in the worker's cache
    prefill_rest: dict[str, list[int]] = field(default_factory=dict)  # KV node -> prompt tokens of the Run
                                                                 # being prefilled in chunks, not yet sent
    prefill_sent: dict[str, int] = field(default_factory=dict)   # KV node -> tokens of that Run already sent
    ranks_opened: set[int] = field(default_factory=set)          # ranks that received OpenRequest
    port_inputs: dict[str, Any] = field(default_factory=dict)    # "input:<node>.<port>" -> value, read before
                                                                 # `input_items` (ports sharing a dtype)
    readers: dict[int, tuple[int, int]] = field(default_factory=dict)  # input item -> (track, state) that read it
    produced: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> (rank, runs dispatched so far)
    replicas: dict[str, int] = field(default_factory=dict)       # data-parallel node -> the replica it is bound to
    isolated: bool = False                 # a batch it shared failed: it runs alone until a Run of it passes
    output_ids: list[int] = field(default_factory=list)
    events: OutputQueue[OutputEvent] = field(default_factory=OutputQueue)
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    deadline: float | None = None          # monotonic time after which it is aborted
    finish_reason: str | None = None
    _caps: dict[Count, int] = field(default_factory=dict, repr=False)   # token_cap's answers
    steady: Any = field(default=None, repr=False)   # its SteadyRow while it decodes steadily (steady.py)
    media_names: dict[int, list] | None = field(default=None, repr=False)   # input item -> media_keys.media_names
    placed_pass: int = 0                   # the scheduling pass that last placed a Run of it (--batch-invariant turns)

    # ---- transitions (the only way `state` changes) --------------------------------

    def _move(self, to: RequestState) -> None:
        if to not in LEGAL_TRANSITIONS[self.state]:
            raise IllegalTransition(f"request {self.request_id}: {self.state.name} -> {to.name}")
        self.state = to

    def admit(self) -> None:
        self._move(RequestState.RUNNING)

    def preempt(self) -> None:
        self._move(RequestState.PREEMPTED)
        self.steady = None        # its row is built again once its context is recomputed
        self.kv_fed.clear()
        for node, sent in self.prefill_sent.items():   # a prompt half prefilled in chunks restarts whole
            del self.kv_history[node][len(self.kv_history[node]) - sent:]
        self.prefill_rest.clear()
        self.prefill_sent.clear()
        self.replicas.clear()     # recomputed from scratch: any replica will do

    def resume(self) -> None:
        self._move(RequestState.RUNNING)

    def finish(self, reason: str) -> None:
        self._move(RequestState.FINISHED)
        self._end(OutputEvent(finish_reason=reason))

    def abort(self, reason: str = "abort") -> None:
        self._move(RequestState.ABORTED)
        self._end(OutputEvent(finish_reason=reason))

    def fail(self, message: str, status: int = 500, code: str = "worker_failed") -> None:
        """Ends with an error the client sees as HTTP `status` (a timeout is 504, a shutdown 503)."""
        self._move(RequestState.FAILED)
        self._end(OutputEvent(finish_reason="error", error=message, status=status, code=code))

    def _end(self, event: OutputEvent) -> None:
        self.finish_reason = event.finish_reason
        self.events.put_nowait(event)

    # ---- what cursors and the scheduler read --------------------------------------

    def input_dtypes(self) -> list[str]:
        return [dtype for dtype, _ in self.input_items]

    def input_for(self, item: int, dtype: str, reader: tuple[int, int]) -> tuple[int, Any] | None:
        """(item index, value) a request-input port of `dtype` reads in state `reader` = (track, state).

        A for_each state (`item` >= 0) reads that item, a plain state (-1) the first one, of
        the port's modality (a `tokens` port reads text) that no other state has read: an
        input belongs to the state that takes it in (t2i's `draw` does not re-read the prompt).
        A for_each state's `tokens` port at a `MediaInput` item reads that item's placeholders.
        """
        modality = "text" if dtype == "tokens" else dtype
        candidates = [item] if item >= 0 else range(len(self.input_items))
        for i in candidates:
            if i >= len(self.input_items) or self.readers.get(i, reader) != reader:
                continue
            kind, value = self.input_items[i]
            if kind == modality:
                return i, value.value if isinstance(value, (MediaInput, SizedInput)) else value
            if item >= 0 and dtype == "tokens" and isinstance(value, MediaInput):
                return i, value.tokens          # an LM reading a media item: its placeholders
        return None

    def prompt_ids(self) -> list[int]:
        """Every token id of the request's inputs in order, a media item's placeholders for it: the prompt."""
        return [t for _, value in self.input_items
                for t in (value.tokens if isinstance(value, MediaInput) else value if isinstance(value, list) else ())]

    def media_rows(self, item: int) -> int:
        """The rows input item `item` stands for in an LM's context when it is a media item (0 otherwise):
        what an encoder reading it computes."""
        value = self.input_items[item][1]
        if isinstance(value, SizedInput):
            return value.rows
        return len(value.tokens) if isinstance(value, MediaInput) else 0

    def note_kv(self, node: str, tokens: list[int]) -> int:
        """Count a Run's tokens into the KV node's history; how many were added."""
        history = self.kv_history.setdefault(node, [])
        if self.kv_fed.get(node, 0) == 0 and history:
            tokens = tokens[len(history):]     # a recompute re-sends the history first
        history.extend(tokens)
        self.kv_fed[node] = len(history)
        return len(tokens)

    def note_dispatch(self, node: str, rank: int, version: int, read: list[int], reader: tuple[int, int] | None) -> None:
        """A Run of `node` was placed in a batch: its run count and the input items it read (by
        `reader`, the (track, state) reading them; None when it read none)."""
        self.produced[node] = (rank, version)
        for i in read:
            self.readers.setdefault(i, reader)

    def next_prefill_chunk(self, node: str, tokens: list[int], size: int) -> tuple[list[int], bool]:
        """The next chunk of at most `size` tokens of the prompt `tokens` of a Run of `node` that
        is prefilled in chunks (`tokens` is ignored once the first chunk went), and whether more
        of it follows."""
        rest = self.prefill_rest.pop(node, tokens)
        chunk, rest = rest[:size], rest[size:]
        if rest:
            self.prefill_rest[node] = rest
            self.prefill_sent[node] = self.prefill_sent.get(node, 0) + len(chunk)
        else:
            self.prefill_sent.pop(node, None)
        return chunk, bool(rest)

    def token_cap(self, budget: Count) -> int:
        """The most client tokens `budget` (a loop's `max`) allows this request (its params are fixed)."""
        cap = self._caps.get(budget)
        if cap is None:
            cap = self._caps[budget] = resolve_count(budget, self.params)
        return cap

    def value_key(self, key: str, rank: int) -> str:
        """Where a Run on `rank` finds value `key` ("<node>.<port>"): the plain key on the
        producer's rank, else the version the producer's latest run pushed there."""
        producer = self.produced.get(key.rsplit(".", 1)[0])
        return key if producer is None or producer[0] == rank else f"{key}#{producer[1]}"

    def last_token(self, key: str) -> int | None:
        ids = self.last_values.get(key)
        return ids[-1] if ids else None

    # ---- output --------------------------------------------------------------------

    def emit_tokens(self, token_ids: list[int], logprobs: Sequence[TokenLogprob] = ()) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.output_ids.extend(token_ids)
        self.events.put_nowait(OutputEvent(token_ids=list(token_ids), logprobs=list(logprobs)))

    def own_tensors(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """This request's share of a batch's tensors ("<request_id>/<key>"), by key."""
        prefix = f"{self.request_id}/"
        return {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}

    def emit_tensors(self, tensors: dict[str, Any]) -> None:
        self.events.put_nowait(OutputEvent(tensors=tensors))

    @property
    def is_done(self) -> bool:
        for t in self.tracks:
            if not t.is_done:
                return False
        return True
