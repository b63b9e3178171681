"""A decoder LM executor given a prompt in chunks (`WorkItem.partial`) samples what it samples
from the whole prompt, repetition penalty over the prompt included."""
from __future__ import annotations

from pathlib import Path

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.conductor.local_run import LocalRun
from runtime.worker.executors import executor_for
from runtime.model_executor.sampling import SamplingParams
from runtime.transport.messages import WorkItem
from runtime.transport.request_params import RequestParams
from runtime.worker.loader import load_rank

ROOT = Path(__file__).resolve().parents[4]
PARAMS = RequestParams(sampling=SamplingParams(temperature=0.0, repetition_penalty=1.8))


def _executor():
    plan = compile_file(str(ROOT / "graphs/smollm2.yaml"), Options(preset="tiny")).plan
    module, _ = load_rank(plan, 0, None)["lm"]
    return LocalRun(executor_for(plan.node("lm"), module, 0, plan))


def _decode(ex, rid: int, first: int, steps: int) -> list[int]:
    tokens = [first]
    for _ in range(steps):
        tokens += ex.run([WorkItem(request_id=rid, tokens=[tokens[-1]])], [{}])[0].tokens
    return tokens


def test_chunked_prompt_samples_the_whole_prompt_tokens() -> None:
    ex = _executor()
    assert ex.executor.chunks_prefill
    prompt = [(7 * i) % 300 + 3 for i in range(45)]
    ex.executor.open(1, PARAMS)
    whole = _decode(ex, 1, ex.run([WorkItem(request_id=1, tokens=prompt)], [{}])[0].tokens[0], 12)
    ex.executor.open(2, PARAMS)
    pieces = [prompt[:16], prompt[16:32], prompt[32:]]
    for piece in pieces[:-1]:
        result = ex.run([WorkItem(request_id=2, tokens=piece, partial=True)], [{}])[0]
        assert result.tokens == [] and result.outputs == {}     # a partial chunk samples nothing
    first = ex.run([WorkItem(request_id=2, tokens=pieces[-1])], [{}])[0].tokens[0]
    assert _decode(ex, 2, first, 12) == whole
    assert len(set(whole)) > 3, "greedy with this penalty should not repeat one token"
