"""A packed mixed batch gives each request the logits it gets alone.

16 requests with different prompt lengths join at different steps; each step runs, in
one forward and in shuffled order, chunked-prefill pieces of some prompts and single
decode tokens of others. Every logit row must equal the same position of that request
run alone (one prefill, then one token at a time).
"""
from __future__ import annotations

import random

import pytest
import torch

from tests.runtime.models.decoder_lm.lm_factories import PagedRunner, build, tiny_dims

NUM_REQUESTS = 16


def _requests(vocab: int, num: int) -> dict[int, list[int]]:
    rng = random.Random(0)
    return {r: [rng.randrange(vocab) for _ in range(rng.randint(2, 14) + rng.randint(3, 6))] for r in range(num)}


def _alone(model, tokens: list[int], prompt_len: int) -> torch.Tensor:
    runner = PagedRunner(model, num_blocks=16, block_size=4)
    rows = [runner.step([("r", tokens[:prompt_len])])[0]]
    rows += [runner.step([("r", [t])])[0] for t in tokens[prompt_len:]]
    return torch.cat(rows)   # (len(tokens), vocab): logits after every position


def _mixed(model, streams: dict[int, list[int]], prompt_lens: dict[int, int],
           block_size: int) -> tuple[dict[int, dict[int, torch.Tensor]], int]:
    """Logits by (request, position) from packed mixed steps, and how many steps mixed prefill with decode."""
    rng = random.Random(1)
    runner = PagedRunner(model, num_blocks=256, block_size=block_size)
    done = {r: 0 for r in streams}
    got: dict[int, dict[int, torch.Tensor]] = {r: {} for r in streams}
    step, mixed_steps = 0, 0
    while any(done[r] < len(streams[r]) for r in streams):
        chunks = []
        for r in streams:
            if r // 4 > step or done[r] == len(streams[r]):   # four requests join per step
                continue
            remaining_prompt = prompt_lens[r] - done[r]
            n = rng.randint(1, remaining_prompt) if remaining_prompt > 0 else 1
            chunks.append((r, streams[r][done[r]:done[r] + n]))
        rng.shuffle(chunks)
        for (r, tokens), logits in zip(chunks, runner.step(chunks)):
            for i in range(len(tokens)):
                got[r][done[r] + i] = logits[i]
            done[r] += len(tokens)
        mixed_steps += {len(t) > 1 for _, t in chunks} == {True, False}
        step += 1
    return got, mixed_steps


@pytest.mark.parametrize("kind, backend, block_size", [
    ("llama_lm", "torch", 4), ("qwen3_moe_lm", "torch", 4), ("llama_lm", "triton", 16)])
@torch.no_grad()
def test_mixed_batch_equals_each_request_alone(kind: str, backend: str, block_size: int) -> None:
    dims = tiny_dims(kind)
    model = build(kind, dims, backend=backend)
    streams = _requests(dims["vocab_size"], NUM_REQUESTS)
    prompt_lens = {r: len(t) - 3 for r, t in streams.items()}
    got, mixed_steps = _mixed(model, streams, prompt_lens, block_size)
    assert mixed_steps >= 3, "the schedule never mixed prefill chunks with decode tokens"
    reference = build(kind, dims, backend="torch")
    for r, tokens in streams.items():
        alone = _alone(reference, tokens, prompt_lens[r])
        mixed = torch.stack([got[r][p] for p in range(len(tokens))])
        # unpacked linears: a packed mixed batch has other row counts than a request alone, and MKL's sgemm may block
        # its rows otherwise (the Triton case also attends with another kernel): fp32 order differences of a few
        # ulps (eps 1.2e-7) on logits |l| <= 0.8; measured max 2.7e-7, 2% of the bound
        torch.testing.assert_close(mixed, alone, atol=1e-5, rtol=1e-5, msg=f"request {r}")
