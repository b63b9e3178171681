"""Constrained sampling: a grammar's mask on its own row of a batch, and output that always parses.

The vocabulary is the byte tokenizer's (token i = byte i, runtime.text.ByteTokenizer), so which tokens a
grammar allows can be written down by hand: the oracle is the grammar read by a person, not the engine.
"""
from __future__ import annotations

import json

import jsonschema
import llguidance
import pytest
import torch

from runtime.model_executor.sampling import GrammarError, GrammarVocab, Sampler, SamplingParams, SamplingState
from runtime.model_executor.sampling.grammar import check_grammar, mask_rows
from runtime.text import ByteTokenizer

WIDTH = 300          # an LM head wider than its 256-token vocabulary (padded rows never allowed)


def _vocab() -> GrammarVocab:
    return GrammarVocab(ByteTokenizer)


def _state(grammar: str | None, **params) -> SamplingState:
    return SamplingState(SamplingParams(**params), constraint=_vocab().constraint(grammar) if grammar else None)


def _lark(text: str) -> str:
    return llguidance.LLMatcher.grammar_from_lark(text)


def test_a_row_may_take_only_what_its_grammar_allows_next() -> None:
    state = _state(_lark('start: "ab" | "ac"'))
    masked = mask_rows(torch.zeros(2, WIDTH), [state.constraint, None])
    allowed = torch.isfinite(masked[0]).nonzero().flatten().tolist()
    assert allowed == [ord("a")]
    assert torch.equal(masked[1], torch.zeros(WIDTH))          # the unconstrained row is untouched
    state.append(ord("a"))
    allowed = torch.isfinite(mask_rows(torch.zeros(1, WIDTH), [state.constraint])[0]).nonzero().flatten()
    assert allowed.tolist() == [ord("b"), ord("c")]
    state.append(ord("c"))
    assert state.constraint.is_done


def test_greedy_takes_the_best_allowed_token_and_the_other_row_its_own_best() -> None:
    logits = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(3))
    logits[:, ord("z")] = 50.0                                 # both rows would say "z" unconstrained
    states = [_state(_lark('start: "x" | "y"'), temperature=0.0), _state(None, temperature=0.0)]
    out = Sampler()(logits, states).token_ids.tolist()
    best_of_xy = ord("x") if logits[0, ord("x")] > logits[0, ord("y")] else ord("y")
    assert out == [best_of_xy, ord("z")]


def test_seeded_unconstrained_rows_draw_the_same_beside_a_constrained_row() -> None:
    logits = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(5))
    alone = Sampler()(logits[1:], [SamplingState(SamplingParams(temperature=1.0, seed=7))]).token_ids
    paired = Sampler()(logits, [_state(_lark('start: "q"'), temperature=1.0),
                                _state(None, temperature=1.0, seed=7)]).token_ids
    assert paired[0] == ord("q") and paired[1] == alone[0]


SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
          "required": ["name", "ok", "n", "tags"], "additionalProperties": False}


@pytest.mark.parametrize("seed", range(5))
def test_random_logits_under_a_json_schema_always_give_valid_json(seed: int) -> None:
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    state = _state(grammar, temperature=1.0, seed=seed)
    noise = torch.Generator().manual_seed(seed)
    for _ in range(2000):
        token = int(Sampler()(torch.randn(1, WIDTH, generator=noise) * 3, [state]).token_ids[0])
        state.append(token)
        if state.constraint.is_done:
            break
    value = json.loads(bytes(state.output_ids).decode())
    jsonschema.validate(value, SCHEMA)


def test_a_broken_grammar_is_a_grammar_error() -> None:
    with pytest.raises(GrammarError):
        check_grammar(llguidance.LLMatcher.grammar_from_json_schema({"type": "nonsense"}))
    with pytest.raises(GrammarError):
        _vocab().constraint(_lark("start: undefined_rule"))


def test_an_undone_sample_is_forgotten_by_the_grammar_and_the_history() -> None:
    state = _state(_lark('start: "ab"'), repetition_penalty=1.5)
    state.append(ord("a"))
    state.penalty_tensors(WIDTH)
    state.undo_last()                         # a prompt piece's sample the request does not keep
    assert state.output_ids == []
    assert torch.isfinite(mask_rows(torch.zeros(1, WIDTH), [state.constraint])[0]).nonzero().flatten().tolist() \
        == [ord("a")]
    counts, _ = state.penalty_tensors(WIDTH)
    assert counts.sum() == 0


def test_several_constrained_rows_get_their_own_masks_in_one_batch() -> None:
    states = [_state(_lark('start: "x" | "y"')), _state(None), _state(_lark('start: "q"')), _state(_lark('start: "ab"'))]
    masked = mask_rows(torch.zeros(4, WIDTH), [s.constraint for s in states])
    allowed = [torch.isfinite(row).nonzero().flatten().tolist() for row in masked]
    assert allowed == [[ord("x"), ord("y")], list(range(WIDTH)), [ord("q")], [ord("a")]]
