"""What an executor is: the interface the worker calls (`Executor`), and what one batch gives back."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from runtime.model_executor.sampling import GrammarVocab, SamplerOutput, SamplingState
from runtime.transport.messages import TokenLogprob, WorkItem
from runtime.transport.request_params import RequestParams


@dataclass
class ExecResult:
    """One request's outcome of a batch."""

    tokens: list[int] = field(default_factory=list)            # sampled token ids
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # output port -> tensor
    finished: str = ""                                         # the node ends the request's loop ("eos")
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, when the request asked


def token_logprobs(sampled: SamplerOutput, row: int, state: SamplingState) -> list[TokenLogprob]:
    """An ExecResult's `logprobs` for the token sampled at `row`: [] unless its request asked."""
    found = sampled.row_logprobs(row, state.params.logprobs)
    return [] if found is None else [TokenLogprob(*found)]


class RunGroup(Protocol):
    """Executors that run their queued batches as one call (BAGEL's CFG branches share one engine)."""

    def run_group(self, calls: Sequence[tuple[Executor, list[WorkItem], list[dict[str, torch.Tensor]]]]
                  ) -> list[list[ExecResult]]: ...


class Executor(Protocol):
    """What the worker asks of a node's executor. Executors subclass it and override what applies: every
    member but `run` has a default that means "this node does not do that"."""

    kv_blocks: int = 0                    # KV pool size in blocks (0: the node keeps no KV cache)
    kv_block_size: int = 0                # tokens per block
    # the cache's prefix key root (hex; "" = no prefix reuse the conductor decides) and the token ids
    # whose blocks may not be shared by id alone (placeholders an encoder fills)
    kv_prefix_key: str = ""
    kv_prefix_stop_ids: frozenset[int] = frozenset()
    kv_media_ids: frozenset[int] = frozenset()   # placeholders named by their media item (conductor/media_keys.py)
    kv_pool: str = ""                     # the node whose pool holds its tables, when several nodes share one cache
    chunks_prefill: bool = False          # long prompts may come in chunks, one Run each
    compiled_buckets: tuple[int, ...] = ()   # batch sizes with a compiled step
    group: RunGroup | None = None         # queued batches of one group run as one call

    def open(self, request_id: int, params: RequestParams) -> None:
        return None

    def run(self, items: list[WorkItem], inputs: list[dict[str, torch.Tensor]]) -> list[ExecResult]: ...

    def close(self, request_id: int, kv_only: bool) -> None:
        return None

    def take_vocab(self, vocab: GrammarVocab) -> bool:
        """Sample under requests' grammars with `vocab` (the node's tokenizer, loaded when first asked);
        whether the node does (a grammar sent to one that does not is refused by the server)."""
        return False

    def kv_used_blocks(self) -> int:
        return 0


class CachelessExecutor(Executor):
    """Base of executors whose node keeps no KV cache and no per-request state."""
