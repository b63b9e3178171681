"""Chunk policies and the per-request buffer of one streaming edge (consumer side).

A producer (e.g. the Orpheus LM emitting audio tokens) pushes items one by one; the
consumer (the SNAC decoder) takes chunks when the edge's policy releases one:

  * Fixed(k)                 every k new items, emit them;
  * Sliding(window, stride)  first when `window` items exist, then every `stride` new
                             items emit the last `window` (Orpheus: 28 / 7);
  * LeftContext(chunk, context)  every `chunk` new items, emit them with up to `context`
                             earlier items prepended (Qwen3-Omni code2wav: 25 / 25).

Guarantees (tests/runtime/streams/test_chunk_policy.py checks them with hypothesis):
every pushed item is delivered as a *new* item exactly once and in order; earlier items
reappear only as a chunk's leading context; when the producer finishes, the remainder is
flushed and exactly one chunk, the last, is final. When the producer ended right on a
chunk boundary after a non-final release, the final chunk carries no new items, only the
policy's context (the last `window` items for Sliding, `context` for LeftContext), so a
consumer such as SNAC can finish the samples it held back for lack of right context; the buffer never
holds more than `capacity` items, because the producer may push only while
`can_push()` — the conductor uses that as back-pressure.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, Union

Item = TypeVar("Item")


@dataclass(frozen=True)
class Fixed:
    """Emit every `k` new items."""

    k: int

    def min_capacity(self) -> int:
        return self.k


@dataclass(frozen=True)
class Sliding:
    """First emit at `window` items, then the last `window` items every `stride` new ones."""

    window: int
    stride: int

    def min_capacity(self) -> int:
        # the last window is retained (a final chunk may re-send it) plus one stride of new items
        return self.window + self.stride


@dataclass(frozen=True)
class LeftContext:
    """Emit every `chunk` new items with up to `context` earlier items prepended."""

    chunk: int
    context: int

    def min_capacity(self) -> int:
        return self.context + self.chunk


ChunkPolicy = Union[Fixed, Sliding, LeftContext]


def validate_policy(policy: ChunkPolicy) -> None:
    """Raise ValueError for numbers no policy can work with."""
    sizes = {"Fixed": ("k",), "Sliding": ("window", "stride"), "LeftContext": ("chunk", "context")}
    for name in sizes[type(policy).__name__]:
        value = getattr(policy, name)
        if not isinstance(value, int) or value < (0 if name == "context" else 1):
            raise ValueError(f"{type(policy).__name__}.{name} must be a positive integer, got {value!r}")
    if isinstance(policy, Sliding) and policy.stride > policy.window:
        raise ValueError(f"Sliding stride {policy.stride} exceeds window {policy.window}: items would be skipped")


@dataclass(frozen=True)
class Chunk(Generic[Item]):
    """One release of a streaming edge to its consumer."""

    items: list[Item]   # leading context items, then the new items, in production order
    start: int          # index in the producer's sequence of items[0]
    num_context: int    # items[:num_context] were already delivered as new items before
    is_final: bool      # the producer has finished and this is the last chunk

    @property
    def new_items(self) -> list[Item]:
        return self.items[self.num_context:]


class StreamBuffer(Generic[Item]):
    """The consumer-side buffer of one streaming edge for one request."""

    def __init__(self, policy: ChunkPolicy, capacity: int | None = None) -> None:
        validate_policy(policy)
        self.policy = policy
        self.capacity = capacity if capacity is not None else 2 * policy.min_capacity()
        if self.capacity < policy.min_capacity():
            raise ValueError(f"capacity {self.capacity} is below the policy's minimum {policy.min_capacity()}")
        self._items: deque[Item] = deque()
        self._base = 0            # producer index of self._items[0]
        self._num_produced = 0    # items pushed so far
        self._num_released = 0    # items delivered as new so far
        self._is_finished = False
        self._is_final_sent = False

    # ---- producer side -------------------------------------------------------
    def can_push(self) -> bool:
        return not self._is_finished and len(self._items) < self.capacity

    def push(self, item: Item) -> None:
        if self._is_finished:
            raise RuntimeError("push after finish on a streaming edge")
        if len(self._items) >= self.capacity:
            raise OverflowError(f"streaming buffer full ({self.capacity} items): check can_push() first")
        self._items.append(item)
        self._num_produced += 1

    def finish(self) -> None:
        self._is_finished = True

    # ---- consumer side -------------------------------------------------------
    @property
    def is_done(self) -> bool:
        """The final chunk has been taken: the buffer can be freed."""
        return self._is_final_sent

    def __len__(self) -> int:
        return len(self._items)

    def take(self) -> Chunk[Item] | None:
        """The next chunk the policy releases now, or None."""
        if self._is_final_sent:
            return None
        span = self._next_span()
        if span is None:
            return None
        start, end = span
        assert start >= self._base, "a chunk reaches before the retained items"
        is_final = self._is_finished and end == self._num_produced
        items = [self._items[i - self._base] for i in range(start, end)]
        chunk = Chunk(items=items, start=start, num_context=max(0, self._num_released - start), is_final=is_final)
        self._num_released = end
        self._is_final_sent = is_final
        self._drop_unneeded()
        return chunk

    def _next_span(self) -> tuple[int, int] | None:
        """[start, end) of the next chunk in producer indices, or None if none is due."""
        p, done, pending = self.policy, self._num_released, self._num_produced - self._num_released
        if isinstance(p, Fixed):
            step = p.k
        elif isinstance(p, Sliding):
            step = p.window if done == 0 else p.stride
        else:
            step = p.chunk
        if pending >= step:
            end = done + step
        elif self._is_finished:
            end = self._num_produced
        else:
            return None
        # producer ended on a boundary: a final chunk with no new items, whose leading
        # context (Sliding, LeftContext) lets the consumer finish what it held back
        if isinstance(p, Sliding):
            return max(0, end - p.window), end
        if isinstance(p, LeftContext):
            return max(0, done - p.context), end
        return done, end

    def _drop_unneeded(self) -> None:
        p = self.policy
        retain = p.window if isinstance(p, Sliding) else p.context if isinstance(p, LeftContext) else 0
        keep_from = max(0, self._num_released - retain)
        while self._base < keep_from:
            self._items.popleft()
            self._base += 1


def policy_from_spec(spec: dict[str, Any]) -> ChunkPolicy:
    """Build a policy from its plan/YAML form: {"fixed": K} | {"sliding": {...}} | {"left_context": {...}}."""
    if len(spec) != 1:
        raise ValueError(f"a chunk policy has exactly one of fixed / sliding / left_context, got {sorted(spec)}")
    (name, value), = spec.items()
    if name == "fixed":
        policy: ChunkPolicy = Fixed(value)
    elif name == "sliding":
        policy = Sliding(value["window"], value["stride"])
    elif name == "left_context":
        policy = LeftContext(value["chunk"], value["context"])
    else:
        raise ValueError(f"unknown chunk policy {name!r} (fixed, sliding, left_context)")
    validate_policy(policy)
    return policy
