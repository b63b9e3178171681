"""An edit of a picture another running edit holds, admitted on a BAGEL pool too small for its full blocks.

The conductor keys BAGEL's KV rows before any worker runs (runtime/models/bagel/row_keys.py): a picture's
VAE and ViT rows by the digest of the request's pixels, text by its ids, and each CFG branch is a table of
the rank's one pool, so a branch whose context equals another's takes its blocks. An edit of a picture that
a running edit holds, with the same instruction, is then charged only the blocks it really takes (the copies
of partly filled last blocks), from its first Run. Here a long edit (many steps) holds the picture while the
second arrives; the pool is sized so that the second fits with its new blocks and not with its full ones:
/metrics must count no hold and no preemption. Both servers run `--batch-invariant`; the second edit's image
is bit-equal to the same edit alone on a server with prefix caching off.

Sizes (tiny preset, byte tokenizer, 16-row blocks) are computed below from the picture and the prompt.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from runtime.models.bagel.row_keys import encoder_rows
from runtime.models.bagel.segments import SegmentKind
from runtime.text import ByteTokenizer
from tests.runtime.models.bagel.bagel_harness import tiny_plan
from tests.runtime.serving.bagel.conftest import client_of, edit, pixels, png
from tests.runtime.serving.conftest import Server, serve_pair_with_pool

BS = 16
SIDE = 128                 # the tiny preset's largest picture: its VAE rows outnumber its ViT rows
IMAGE = png(SIDE, SIDE, seed=21)
PROMPT = "repaint the picture in the warm colours of an autumn evening, keeping every shape where it is"
LONG = {"seed": 3, "steps": 150}     # the running edit: it holds the picture's blocks throughout
SHORT = {"seed": 8, "steps": 4}
NODES = 3                  # llm, llm_cfg_text, llm_cfg_img: one pool of the sum of theirs


def _blocks(rows: int) -> int:
    return -(-rows // BS)


@pytest.fixture(scope="module")
def sizes():
    rows = encoder_rows(tiny_plan(), SIDE, SIDE)
    picture = rows[SegmentKind.VAE] + 2 + rows[SegmentKind.VIT] + 2      # [soi] rows [eoi], each
    text = len(ByteTokenizer().encode(PROMPT, add_special_tokens=False)) + 2
    # an edit's three tables: full (picture, text), text-dropped (picture), image-dropped (text)
    full = {"full": _blocks(picture + text), "cfg_text": _blocks(picture), "cfg_img": _blocks(text)}
    # the long edit holds full's blocks (text-dropped shares them but the partly filled one text was
    # written into after) and image-dropped's; the short one takes a copy of each partly filled last block
    held = full["full"] + 1 + full["cfg_img"]
    pool = max(sum(full.values()), held + 6)      # the short edit alone fits (prefix caching off: nothing shared)
    pool = NODES * -(-pool // NODES)
    return {"picture": picture, "text": text, "full": sum(full.values()), "pool": pool}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, sizes):
    """(prefix caching on, off)."""
    yield from serve_pair_with_pool(tmp_path_factory, "bagel", "llm", sizes["pool"] // NODES, "--batch-invariant")


class LongEdit(threading.Thread):
    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server, self.error, self.ended_at = server, None, 0.0

    def run(self) -> None:
        try:
            edit(client_of(self.server), IMAGE, prompt=PROMPT, extra=LONG)
        except Exception as exc:   # noted for the test to raise
            self.error = exc
        finally:
            self.ended_at = time.monotonic()


def test_an_edit_of_a_held_picture_is_charged_only_its_new_blocks(sizes, servers: tuple[Server, Server]) -> None:
    cached, uncached = servers
    queried = 'mstar_prefix_cache_query_tokens_total{node="llm",rank="0"}'
    hits = 'mstar_prefix_cache_hit_tokens_total{node="llm",rank="0"}'
    counters = ("mstar_kv_admission_holds", "mstar_kv_preemptions")
    before, start = [cached.metric(m) for m in counters], cached.metric(queried)
    long = LongEdit(cached)
    long.start()
    # the long edit's context is placed once its rows were looked up: full's picture and text, image-dropped's
    # text (text-dropped takes full's picture: no lookup)
    deadline = time.monotonic() + 120
    while cached.metric(queried) - start < sizes["picture"] + 2 * sizes["text"]:
        assert time.monotonic() < deadline and long.is_alive(), long.error
        time.sleep(0.05)
    held = round(cached.metric("mstar_kv_cache_usage") * sizes["pool"])
    reused = cached.metric(hits)
    got = pixels(edit(client_of(cached), IMAGE, prompt=PROMPT, extra=SHORT).data[0].b64_json)
    answered = time.monotonic()
    reused = cached.metric(hits) - reused
    long.join(300)
    assert long.error is None and long.ended_at > answered, long.error   # it held its blocks throughout
    # the figures the closing note quotes (`pytest -s` shows them)
    print(f"pool {sizes['pool']} blocks, held by the long edit {held}, the short edit in full {sizes['full']}, "
          f"rows it reused {reused:.0f}")
    # with the short edit's full blocks the pool overruns: only a charge of its new blocks admits it at once
    assert held + sizes["full"] > sizes["pool"]
    assert [cached.metric(m) for m in counters] == before                  # neither held nor preempted
    assert reused >= sizes["picture"] + 2 * sizes["text"]    # full's picture and text, image-dropped's text
    alone = pixels(edit(client_of(uncached), IMAGE, prompt=PROMPT, extra=SHORT).data[0].b64_json)
    assert got.std() > 5 and np.array_equal(got, alone)     # bit for bit (--batch-invariant)
