"""The chat suite's requests, round after round: fresh in the cold mode, the same again in the warm one.

Each request is a conversation whose first message is a system message that starts with a nonce
("17. You are a helpful assistant."): SmolLM2's chat template writes `<|im_start|>system\n` (3 tokens)
and then the nonce's digits, so two requests of a run part within their first 16 tokens and share no
KV block. Without a system message of its own the template would put its default one (about 26 tokens,
the same in every request) first, and every prompt's first block would be a cache hit.

`Rounds` gives one side its bursts: its k-th call returns the same requests as every other side's
k-th call (the sides compare the same prompts, round by round), new nonces every call in the cold
mode and the first call's requests every time in the warm one (`bench.cache_state`).
"""
from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Sequence

from bench.cache_state import COLD, MODES
from bench.openai_load import ChatJob

SYSTEM = "{nonce}. You are a helpful assistant."


class Rounds:
    """One side's bursts of `jobs`, each job's system message carrying its nonce."""

    def __init__(self, jobs: Sequence[ChatJob], mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"cache mode must be one of {MODES}, got {mode!r}")
        self.jobs, self.mode = list(jobs), mode
        self.calls = itertools.count()

    def next(self) -> list[ChatJob]:
        """The next burst: call k carries nonces k * len(jobs) + 1 ... (cold), or those of call 0 (warm)."""
        k = next(self.calls) if self.mode == COLD else 0
        first = k * len(self.jobs) + 1
        return [replace(job, system=SYSTEM.format(nonce=first + i)) for i, job in enumerate(self.jobs)]
