"""The conductor owns the Qwen3-Omni thinker's block tables and decides its prefix reuse
(runtime/conductor/kv_ledger.py), so chats whose system prompt is cached cost only the blocks they
really take: on a pool too small for three chats' full blocks, three chats that share their system
prompt run at once, none held for room, and answer as they do alone.

Sizes (tiny preset, byte tokenizer, 16-token blocks): each chat holds 339 prompt rows (~300 of them
the shared system prompt, its own piece of the prompt) and 480 answer rows: 52 blocks in full, ~34
of its own beside the ~18 shared. The pool has 128 blocks: three chats in full (156) do not fit,
counted as the worker holds them (~18 + 3 x 34 = 120) they do. A ledger that charged full blocks
holds the third chat back or preempts one as the answers grow: the test asks that the first is still
answering when the third's first token arrives, and that /metrics counts no hold and no preemption."""
from __future__ import annotations

import threading
import time

import openai
import pytest

from tests.runtime.serving.conftest import Server, serve_with_pool
from tests.runtime.serving.speech.conftest import OMNI

SYSTEM = "You answer questions about the weather in one short, friendly sentence, and you never use lists. " * 3
POOL_BLOCKS = 128
ANSWER = 480


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory: pytest.TempPathFactory):
    yield from serve_with_pool(tmp_path_factory, "qwen3_omni", "thinker", POOL_BLOCKS)


class Chat(threading.Thread):
    """One streamed chat; notes when its first token and its end arrived."""

    def __init__(self, server: Server, question: str) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
        self.question, self.text = question, ""
        self.first = threading.Event()
        self.ended_at: float | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            stream = self.client.chat.completions.create(
                model=OMNI, max_tokens=ANSWER, temperature=0.0, stream=True, extra_body={"ignore_eos": True},
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.question}])
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    self.text += chunk.choices[0].delta.content
                    self.first.set()
        except Exception as exc:   # noted for the test to raise
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.first.set()


def test_chats_sharing_a_cached_system_prompt_run_at_once_on_a_pool_too_small_for_their_full_blocks(
        small_pool: Server) -> None:
    questions = ["Will it rain in Oslo?", "Is it windy in Lima?", "How warm is Cairo?"]
    # the thinker's own prefix cache is on /metrics from the start (its worker's Ready), at zero
    assert [small_pool.metric(f"mstar_prefix_cache_{n}_total") for n in ("queries", "hit_tokens")] == [0, 0]
    alone = []
    for q in questions:                              # one at a time: the answers to match, and the cache warm
        chat = Chat(small_pool, q)
        chat.run()
        assert chat.error is None, chat.error
        alone.append(chat.text)
    held = [small_pool.metric(m) for m in ("mstar_kv_admission_holds", "mstar_kv_preemptions")]
    chats = []
    for q in questions:                              # each starts once the one before is answering
        chat = Chat(small_pool, q)
        chat.start()
        assert chat.first.wait(120) and chat.error is None, chat.error
        chats.append(chat)
    third_first = time.monotonic()
    for chat in chats:
        chat.join(300)
        assert chat.error is None, chat.error
    assert chats[0].ended_at > third_first           # the first was still answering: all three ran at once
    # neither held back for room nor preempted for it
    assert [small_pool.metric(m) for m in ("mstar_kv_admission_holds", "mstar_kv_preemptions")] == held
    assert [c.text for c in chats] == alone          # greedy, fp32: the same answers at once as alone
    assert small_pool.metric("mstar_prefix_cache_hit_tokens_total") > 0     # the shared system prompt, reused
