"""What a step's scheduling forms: a batch of one node for one rank (or TP group), one entry per
request's Run in it. The scheduler builds them (runtime/conductor/scheduler.py; steady decode rows
keep theirs from step to step, runtime/conductor/steady.py), the conductor sends them and applies
their results."""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import torch

from runtime.conductor.cursor import PendingRun
from runtime.conductor.plan_index import RunFacts
from runtime.conductor.request import Request
from runtime.transport.messages import WorkItem


class Entry(msgspec.Struct):
    """One request's Run inside a batch (one is built per row per step: a struct, built in C)."""

    request: Request
    pending: PendingRun
    item: WorkItem
    facts: RunFacts                    # what the plan fixes for Runs of its node in its walk
    tensors: dict[str, torch.Tensor] = {}   # frames to attach (a fresh dict per entry)
    read: list[int] = []               # request input items this Run reads
    version: int = 0                   # this Run's count of its node's runs
    kv_from: int | None = None         # rank whose KV cache of the node moves here
    kv_added: int = 0                  # tokens this Run added to the KV history
    steady: bool = False               # placed by its SteadyRow: KV history counted, ranks opened (steady.py)
    rows: int = 0                      # an encoder Run's rows: its media item's placeholders (Scheduler._reserve)


@dataclass
class PlannedBatch:
    rank: int                                          # the rank whose results count (a TP group's lead)
    node: str
    entries: list[Entry] = field(default_factory=list)
    group: list[int] = field(default_factory=list)     # every rank that runs it, lead first ([rank] without TP)
    num_tokens: int = 0                                # tokens its entries compute (cached ones are reused)

    def __post_init__(self) -> None:
        self.group = self.group or [self.rank]
