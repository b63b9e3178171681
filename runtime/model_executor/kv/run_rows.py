"""The rows a Run writes into its KV cache, for a node whose Runs' tokens do not say (`Family.kv_rows`).

The conductor grows a request's block table by each Run's rows before the Run goes out
(runtime/conductor/kv_ledger.py). For most LMs those are the Run's token ids. A family whose rows are
laid out otherwise declares a rule, `factory(plan, node)` -> rule(`KVRun`) -> `KVRows`: the Qwen3-Omni
talker (its prompt comes from a stream: it has no tokens) and BAGEL's LM (a prompt's text gets its
markers, a picture its encoders' rows, a generation step writes none).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from runtime.model_executor.kv.prefix_cache import Row


@dataclass(frozen=True)
class Medium:
    """The media input item a Run's walk reads (its for_each item), as the conductor knows it."""

    digest: bytes                  # 16 bytes naming the item (runtime/conductor/media_keys.py)
    shape: tuple[int, ...]         # its value's shape (a picture: (H, W, 3))


@dataclass(frozen=True)
class KVRun:
    """What the conductor knows of a Run when it grows the Run's table."""

    walk: str
    tokens: Sequence[int]                      # the Run's token ids (WorkItem.tokens)
    held: int                                  # rows the request's table holds already
    prompt_ids: Callable[[], list[int]]        # the request's prompt (asked only where needed)
    medium: Medium | None = None               # the media item of the Run's for_each state, if any


@dataclass(frozen=True)
class KVRows:
    """The rows a Run writes: how many, what they hold (the prefix cache's keys), and how they are reused."""

    count: int
    rows: Sequence[Row] | None = None   # None: unknown, so neither looked up nor cached
    whole: bool = False                 # reused whole from the cache or computed whole (they attend to each other)


KVRowRule = Callable[[KVRun], KVRows]

__all__ = ["KVRowRule", "KVRows", "KVRun", "Medium"]
