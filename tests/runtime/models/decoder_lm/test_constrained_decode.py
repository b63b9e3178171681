"""The decoder LM executor under a request's grammar: its tokens spell what the grammar allows, the
request ends when the grammar is complete, a grammar for another node leaves this one free, and a node
with no tokenizer refuses a grammar at open (its request fails, no batch does)."""
from __future__ import annotations

from pathlib import Path

import llguidance
import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.local_run import LocalRun
from runtime.model_executor.components import component_class
from runtime.model_executor.sampling import GrammarVocab, SamplingParams
from runtime.models.decoder_lm.executors import DecoderLMExecutor
from runtime.text import ByteTokenizer
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams

GRAPHS = Path(__file__).resolve().parents[4] / "graphs"
WORD = llguidance.LLMatcher.grammar_from_lark('start: "mstar" | "mask"')


@pytest.fixture(scope="module")
def plan():
    return compile_file(str(GRAPHS / "smollm2.yaml"), Options(preset="tiny")).plan     # random weights, byte ids


def _executor(plan, vocab: bool = True) -> DecoderLMExecutor:
    node = plan.node("lm")
    ex = DecoderLMExecutor(node, component_class(node.kind)(node.dims, node.args).eval(), 0, plan)
    if vocab:
        assert ex.take_vocab(GrammarVocab(ByteTokenizer))
    return ex


def _decode(run: LocalRun, rid: int, grammars: dict[str, str], steps: int = 12) -> tuple[list[int], str]:
    run.executor.open(rid, RequestParams(sampling=SamplingParams(temperature=1.0, seed=rid), grammars=grammars))
    out = run.run([WorkItem(request_id=rid, tokens=list(b"say it: "))], [{}])[0]
    tokens, finished = list(out.tokens), out.finished
    while not finished and len(tokens) < steps:
        out = run.run([WorkItem(request_id=rid, tokens=tokens[-1:])], [{}])[0]
        tokens, finished = tokens + out.tokens, out.finished
    return tokens, finished


def test_a_constrained_request_spells_a_word_of_its_grammar_and_ends_there(plan) -> None:
    run = LocalRun(_executor(plan))
    for rid in range(1, 5):
        tokens, finished = _decode(run, rid, {"lm": WORD})
        assert bytes(tokens) in (b"mstar", b"mask") and finished == "eos"


def test_a_grammar_for_another_node_leaves_this_one_free(plan) -> None:
    tokens, finished = _decode(LocalRun(_executor(plan)), 1, {"talker": WORD})
    assert finished == "" and len(tokens) == 12 and tokens[:5] not in (list(b"mstar"), list(b"mask"))


def test_a_node_without_a_tokenizer_refuses_a_grammar_when_the_request_opens(plan) -> None:
    ex = _executor(plan, vocab=False)
    with pytest.raises(ValueError, match="no tokenizer to match a grammar on"):
        ex.open(1, RequestParams(grammars={"lm": WORD}))
