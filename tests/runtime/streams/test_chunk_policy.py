"""Chunk-policy semantics, exhaustively over item counts, policies and consumer speeds."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.streams.chunk_policy import (
    Chunk,
    Fixed,
    LeftContext,
    Sliding,
    StreamBuffer,
    policy_from_spec,
)

policies = st.one_of(
    st.builds(Fixed, st.integers(1, 9)),
    st.integers(1, 12).flatmap(lambda w: st.builds(Sliding, st.just(w), st.integers(1, w))),
    st.builds(LeftContext, st.integers(1, 9), st.integers(0, 9)),
)


def drive(buf: StreamBuffer[int], num_items: int, speeds: list[int]) -> list[Chunk[int]]:
    """Producer pushes while it may; the consumer takes up to speeds[i] chunks per tick."""
    chunks: list[Chunk[int]] = []
    produced, tick = 0, 0
    while not buf.is_done:
        while produced < num_items and buf.can_push():
            buf.push(produced)
            produced += 1
            assert len(buf) <= buf.capacity
            if speeds[tick % len(speeds)] == 0:
                break  # a slow consumer: one item per tick
        if produced == num_items:
            buf.finish()
        for _ in range(max(1, speeds[tick % len(speeds)])):
            chunk = buf.take()
            if chunk is None:
                break
            chunks.append(chunk)
        tick += 1
        assert tick < 10 * (num_items + 10), "the stream stalled: buffer full and nothing released"
    return chunks


@settings(max_examples=400, deadline=None)
@given(policy=policies, num_items=st.integers(0, 80), speeds=st.lists(st.integers(0, 3), min_size=1, max_size=6),
       slack=st.integers(0, 5))
def test_every_item_once_in_order_one_final_bounded(policy, num_items, speeds, slack):
    buf: StreamBuffer[int] = StreamBuffer(policy, capacity=policy.min_capacity() + slack)
    chunks = drive(buf, num_items, speeds)

    delivered = [x for c in chunks for x in c.new_items]
    assert delivered == list(range(num_items))
    assert [c.is_final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert buf.take() is None
    for c in chunks:
        assert c.items == list(range(c.start, c.start + len(c.items)))  # contiguous, in order
        assert 0 <= c.num_context <= len(c.items)


@settings(max_examples=200, deadline=None)
@given(policy=policies, num_items=st.integers(1, 80))
def test_chunk_shapes_follow_the_policy(policy, num_items):
    chunks = drive(StreamBuffer(policy), num_items, [1])
    for c in chunks[:-1]:  # every non-final chunk has the policy's exact shape
        if isinstance(policy, Fixed):
            assert (len(c.new_items), c.num_context) == (policy.k, 0)
        elif isinstance(policy, Sliding):
            assert len(c.items) == policy.window
            assert len(c.new_items) == (policy.window if c.start == 0 and c.num_context == 0 else policy.stride)
        else:
            assert len(c.new_items) == policy.chunk
            assert c.num_context == min(policy.context, c.start + c.num_context)
    last = chunks[-1]
    if isinstance(policy, Sliding):  # the final chunk always ends with the last window
        assert len(last.items) == min(policy.window, num_items)
    if isinstance(policy, LeftContext):
        assert last.num_context == min(policy.context, num_items - len(last.new_items))


def test_orpheus_sliding_windows():
    chunks = drive(StreamBuffer(Sliding(28, 7)), 42, [1])
    assert [(c.start, len(c.items), c.num_context) for c in chunks] == [(0, 28, 0), (7, 28, 21), (14, 28, 21)]
    assert chunks[-1].is_final


def test_code2wav_left_context():
    chunks = drive(StreamBuffer(LeftContext(25, 25)), 60, [1])
    assert [(c.start, len(c.items), c.num_context) for c in chunks] == [(0, 25, 0), (0, 50, 25), (25, 35, 25)]


@pytest.mark.parametrize("policy, context", [(Fixed(4), []), (Sliding(4, 2), [2, 3, 4, 5]),
                                             (LeftContext(2, 3), [3, 4, 5])])
def test_final_chunk_without_new_items_carries_context(policy, context):
    """Ending right after a release: the final chunk re-sends the policy's context only."""
    buf: StreamBuffer[int] = StreamBuffer(policy)
    released = []
    for i in range(6 if not isinstance(policy, Fixed) else 4):
        buf.push(i)
        while (chunk := buf.take()) is not None:
            released.append(chunk)
    buf.finish()
    last = buf.take()
    assert last is not None and last.is_final and last.new_items == []
    assert last.items == context and last.num_context == len(context)
    assert all(not c.is_final for c in released)


def test_push_past_capacity_is_refused():
    buf: StreamBuffer[int] = StreamBuffer(Fixed(2), capacity=2)
    buf.push(0)
    buf.push(1)
    assert not buf.can_push()
    with pytest.raises(OverflowError, match="buffer full"):
        buf.push(2)


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"fixed": 0}, "Fixed.k must be a positive integer"),
        ({"sliding": {"window": 4, "stride": 5}}, "stride 5 exceeds window 4"),
        ({"left_context": {"chunk": 3, "context": -1}}, "LeftContext.context must be"),
        ({"tumbling": 3}, "unknown chunk policy 'tumbling'"),
    ],
)
def test_bad_policies_are_clear_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        policy_from_spec(spec)
