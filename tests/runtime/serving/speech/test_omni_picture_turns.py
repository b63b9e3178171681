"""A second turn about a picture, admitted on a Qwen3-Omni pool too small for its full blocks.

The conductor keys the thinker's rows before any worker runs, the picture's pads by the image they stand
for (runtime/conductor/media_keys.py), so a request whose system prompt, picture and first question
another running request holds is charged only the blocks beyond them, from its first Run. Here a long
answer to the first turn's prompt holds those blocks while the second turn arrives; the pool is sized so
that the two fit with the second turn's new blocks, and not with its full blocks: /metrics must count no
hold and no preemption. Both servers run `--batch-invariant`; the second turn's tokens and log-probabilities
are bit-equal to the same turn alone on a server with prefix caching off.

Sizes (tiny preset, byte tokenizer, 16-token blocks) are computed below from the prompts, not assumed.
"""
from __future__ import annotations

import threading
import time

import openai
import pytest

from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from runtime.entrypoints.http.chat_inputs import chat_inputs_for
from runtime.text import ByteTokenizer
from tests.runtime.models.qwen3_omni.test_image_chat_parity import image_part, picture
from tests.runtime.models.qwen3_omni.test_thinker_prefix_cache import _piece, expected_reuse
from tests.runtime.serving.conftest import Server, serve_pair_with_pool
from tests.runtime.serving.speech.conftest import OMNI

# a long system prompt: the second turn's first Run (this piece) takes more blocks in full than the pool has free
# while the long answer runs, and only one new block. Its length puts the picture's 15 rows from row 3 of a block on:
# the picture's Run (which computes its last row, whose block is then not reused) reuses 13 and computes 2. No Run
# may compute one row past cached blocks: that row is a decode row to the attention backend, whose sums differ from
# the prefill's in the last bits (docs/prefill.md), and the comparison below is bit for bit.
SYSTEM = "You describe pictures in one short sentence and you never use lists or headings. " * 8 + "Be brief, now."
BS = 16
LONG = 900               # the running request's answer (ignore_eos): it holds the shared blocks throughout
SHORT = 8
IMAGE = picture(192, 320, seed=11)      # under the tiny preset's max_image_pixels (65,536)
FIRST = [{"role": "system", "content": SYSTEM},
         {"role": "user", "content": [image_part(IMAGE), {"type": "text", "text": "What is in this picture?"}]}]
SECOND = [*FIRST, {"role": "assistant", "content": "A field of coloured noise."},
          {"role": "user", "content": "And which colour is there most of?"}]


def _blocks(rows: int) -> int:
    return -(-rows // BS)


@pytest.fixture(scope="module")
def sizes():
    plan = compile_file("graphs/qwen3_omni.yaml", Options(preset="tiny", placement="single")).plan
    items = [chat_inputs_for(plan).chat_items(m, ByteTokenizer()) for m in (FIRST, SECOND)]
    assert [[dtype for dtype, _ in it] for it in items] == [["text", "image", "text"]] * 2
    first, second = (sum(len(_piece(*piece)) for piece in it) for it in items)
    long_final = _blocks(first + LONG - 1)          # its prompt and every answer token fed back but the last
    second_full = _blocks(second + SHORT - 1)
    shared = first // BS                            # the first prompt's full blocks, held by the long answer
    pool = long_final + second_full - shared + 1    # + one for a copy-on-write of a shared partly filled block
    # rows each prompt reuses at least: every full block of what was cached before it (but each piece's last row)
    reuse = [expected_reuse(items[0], first + SHORT - 1), expected_reuse(items[1], first)]
    assert reuse[1][1] == len(items[1][1][1].tokens) - 2       # the second turn's picture piece: all but two rows
    computed = [len(_piece(*piece)) - r for it, rs in zip(items, reuse) for piece, r in zip(it, rs)]
    assert min(computed) >= 2, computed                         # no one-row Run (the comment on SYSTEM)
    return {"first": first, "second": second, "second_full": second_full, "pool": pool,
            "reuse": [sum(r) for r in reuse], "piece_full": _blocks(len(items[1][0][1]))}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, sizes):
    """(prefix caching on, off)."""
    yield from serve_pair_with_pool(tmp_path_factory, "qwen3_omni", "thinker", sizes["pool"], "--batch-invariant")


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def answer(server: Server, messages) -> tuple[list[str], list[float], int]:
    """(tokens, their log-probabilities, prompt tokens) of a greedy answer of SHORT tokens."""
    reply = _client(server).chat.completions.create(model=OMNI, max_tokens=SHORT, temperature=0.0, logprobs=True,
                                                    messages=messages)
    content = reply.choices[0].logprobs.content
    return [c.token for c in content], [c.logprob for c in content], reply.usage.prompt_tokens


class LongAnswer(threading.Thread):
    """The first turn's prompt answered at length, streamed; counts the tokens that arrived."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server, self.tokens, self.error = server, 0, None
        self.ended_at = 0.0
        self.halfway = threading.Event()

    def run(self) -> None:
        try:
            stream = _client(self.server).chat.completions.create(
                model=OMNI, max_tokens=LONG, temperature=0.0, stream=True, extra_body={"ignore_eos": True},
                logprobs=True, messages=FIRST)      # a chunk's logprobs list its tokens (bytes: text may lag)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                    self.tokens += len(chunk.choices[0].logprobs.content)
                    if self.tokens >= LONG // 2:
                        self.halfway.set()
        except Exception as exc:   # noted for the test to raise
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.halfway.set()


def test_a_second_turn_about_a_held_picture_is_charged_only_its_new_blocks(sizes, servers: tuple[Server, Server]
                                                                           ) -> None:
    cached, uncached = servers
    first = answer(cached, FIRST)
    assert first[2] == sizes["first"] and first[:2] == answer(uncached, FIRST)[:2]
    counters = ("mstar_kv_admission_holds", "mstar_kv_preemptions")
    before = [cached.metric(m) for m in counters]
    hits = cached.metric("mstar_prefix_cache_hit_tokens_total")
    long = LongAnswer(cached)
    long.start()
    assert long.halfway.wait(300) and long.error is None, long.error
    arrived, reused = long.tokens, [cached.metric("mstar_prefix_cache_hit_tokens_total") - hits]
    hits += reused[0]
    second = answer(cached, SECOND)
    answered = time.monotonic()
    reused.append(cached.metric("mstar_prefix_cache_hit_tokens_total") - hits)
    long.join(300)
    assert long.error is None and long.tokens == LONG, long.error
    assert long.ended_at > answered         # the long answer held its blocks while the second turn ran
    # when the second turn came, the long answer held at least these blocks: with the full blocks of the second
    # turn's first Run alone (the system prompt's piece) they overrun the pool, so only a charge of its new
    # blocks admits it at once
    assert _blocks(sizes["first"] + arrived - 1) + sizes["piece_full"] > sizes["pool"]
    assert [cached.metric(m) for m in counters] == before                 # neither held nor preempted
    # the long answer and the second turn reused the first prompt's blocks, the picture's included
    assert reused[0] >= sizes["reuse"][0] and reused[1] >= sizes["reuse"][1]
    alone = answer(uncached, SECOND)
    assert second[2] == sizes["second"] == alone[2]
    assert second[:2] == alone[:2]          # tokens and log-probabilities, bit for bit (--batch-invariant)
