"""Constrained decoding: a request's grammar masks the tokens its row may sample, step by step.

The grammar engine is llguidance (a Rust parser with a CPU wheel; setup.cfg says why it and not a
hand-written one): the server compiles a request's `response_format` or forced tool call into an
llguidance grammar (JSON text) for the node that writes the answer (`RequestParams.grammars`) and
checks it with `check_grammar`; that node's executor turns it into one matcher per request when the
request opens (`GrammarVocab.constraint`, on the node's own tokenizer), held by its `SamplingState`.
Every step the sampler asks each constrained row's matcher for the allowed tokens (`mask_rows`) and
sets the others to -inf after the penalties, so a constrained row batches with unconstrained ones;
the chosen token advances the matcher (`Constraint.accept`). Once the grammar is complete
(`Constraint.is_done`) the executor ends the request's loop, as an end token would.
"""
from __future__ import annotations

from typing import Callable, Sequence

import llguidance
import llguidance.torch as llg_torch
import torch

_BITS = torch.arange(32, dtype=torch.int32)


class GrammarError(ValueError):
    """A grammar the engine cannot use (the request's fault: the server answers 400)."""


def check_grammar(grammar: str) -> None:
    """GrammarError with the engine's message when `grammar` (llguidance JSON text) does not compile."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise GrammarError(messages[0] if messages else "the grammar does not compile")


def vocab_bytes(tokenizer: object) -> llguidance.LLTokenizer:
    """The engine's view of a text tokenizer: an HF `tokenizers` one by its JSON, the byte tokenizer of
    random-weight LMs as 256 one-byte tokens."""
    eos = sorted(getattr(tokenizer, "eos_token_ids", ()))
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        return llguidance.LLTokenizer(backend.to_str(), eos_token=eos or None)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteVocab()))


class _ByteVocab:
    """UTF-8 bytes as tokens 0..255 (runtime.text.tokenizer.ByteTokenizer); token 0 stands for the end."""

    eos_token_id = 0
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)]
    special_token_ids = [0]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


class Constraint:
    """One request's matcher: which tokens may come next, and the tokens it took."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size

    def accept(self, token_id: int) -> None:
        """Advance past a sampled token (always one the mask allowed); RuntimeError if the matcher refuses."""
        if not self.matcher.consume_token(int(token_id)):
            raise RuntimeError(f"the grammar refused token {token_id}: {self.matcher.get_error()}")

    def rollback(self) -> None:
        """Forget the last accepted token."""
        if not self.matcher.rollback(1):
            raise RuntimeError(f"the grammar could not take back a token: {self.matcher.get_error()}")

    @property
    def is_done(self) -> bool:
        """The grammar is complete: only an end token may follow."""
        return self.matcher.is_stopped()


class GrammarVocab:
    """A node's tokenizer as the engine needs it, built on the first constrained request (`load` gives the
    node's tokenizer; building takes ~0.4 s for a 49k vocabulary) and shared by every request after."""

    def __init__(self, load: Callable[[], object]) -> None:
        self._load = load
        self._tokenizer: llguidance.LLTokenizer | None = None

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:        # the worker's one thread asks: no lock
            self._tokenizer = vocab_bytes(self._load())
        return self._tokenizer

    def constraint(self, grammar: str) -> Constraint:
        tokenizer = self.tokenizer
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return Constraint(matcher, tokenizer.vocab_size)


_executor: llguidance.LLExecutor | None = None


def _parallel() -> llguidance.LLExecutor:
    """llguidance's pool for several rows' masks at once (Rust threads, without the GIL), as many threads as
    torch has (the worker's allotment)."""
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor(num_threads=torch.get_num_threads())
    return _executor


def allowed_tokens(constraints: Sequence[Constraint], width: int) -> torch.Tensor:
    """(R, width) bool: the tokens each constraint allows next; ids past its vocabulary (a padded LM head)
    never are."""
    vocab = max(c.vocab_size for c in constraints)
    words = llg_torch.allocate_token_bitmask(len(constraints), vocab)
    if len(constraints) == 1:
        llg_torch.fill_next_token_bitmask(constraints[0].matcher, words, 0)
    else:
        llg_torch.fill_next_token_bitmask_par(_parallel(), [(c.matcher, i) for i, c in enumerate(constraints)], words)
    failed = next((c for c in constraints if c.matcher.is_error()), None)
    if failed is not None:
        raise RuntimeError(f"the grammar failed: {failed.matcher.get_error()}")
    bits = ((words.unsqueeze(-1) >> _BITS) & 1).flatten(1)[:, :min(vocab, width)].bool()     # (R, <= width)
    if bits.shape[1] == width:
        return bits
    allowed = torch.zeros(len(constraints), width, dtype=torch.bool)
    allowed[:, :bits.shape[1]] = bits
    return allowed


def mask_rows(logits: torch.Tensor, constraints: Sequence[Constraint | None]) -> torch.Tensor:
    """`logits` (B, V) with each constrained row's disallowed tokens at -inf (a copy when any row is
    constrained; unconstrained rows unchanged)."""
    rows = [i for i, c in enumerate(constraints) if c is not None]
    if not rows:
        return logits
    out = logits.clone()
    allowed = allowed_tokens([constraints[i] for i in rows], logits.shape[-1]).to(logits.device)
    index = torch.tensor(rows, device=logits.device)
    out[index] = out[index].masked_fill(~allowed, float("-inf"))
    return out
