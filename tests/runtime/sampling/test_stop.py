"""Stop tokens and stop strings (matched on streamed text, trimmed, never leaked in pieces)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.model_executor.sampling import SamplingParams, StopStringMatcher, stop_token_ids


def test_stop_token_ids_join_eos_and_request_ids() -> None:
    assert stop_token_ids(SamplingParams(stop_token_ids=(7,)), [2, 0]) == {0, 2, 7}
    assert stop_token_ids(SamplingParams(stop_token_ids=(7,), ignore_eos=True), [2]) == {7}


def _stream(stops: list[str], chunks: list[str]) -> tuple[str, bool, list[str]]:
    matcher, emitted, stopped = StopStringMatcher(stops), [], False
    for chunk in chunks:
        text, stopped = matcher.push(chunk)
        emitted.append(text)
        if stopped:
            break
    if not stopped:
        emitted.append(matcher.flush())
    return "".join(emitted), stopped, emitted


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.text(alphabet="abc d", max_size=5), max_size=12),
       stops=st.lists(st.text(alphabet="abcd", min_size=1, max_size=3), min_size=1, max_size=3))
def test_output_is_text_before_first_stop_string(chunks: list[str], stops: list[str]) -> None:
    # reference: the first chunk-prefix of the text that holds a stop string ends the request
    full, hits = "", []
    for chunk in chunks:
        full += chunk
        hits = [i for s in stops if (i := full.find(s)) >= 0]
        if hits:
            break
    got, stopped, emitted = _stream(stops, chunks)
    assert stopped == bool(hits)
    assert got == (full[:min(hits)] if hits else full)
    for n in range(1, len(emitted) + 1):        # no emitted prefix holds a whole stop string
        assert not any(s in "".join(emitted[:n]) for s in stops)


def test_partial_stop_string_is_held_back_then_released() -> None:
    matcher = StopStringMatcher(["</end>"])
    assert matcher.push("hello </e") == ("hello ", False)
    assert matcher.push("x") == ("</ex", False)
    assert matcher.push(" </en") == (" ", False)
    assert matcher.push("d> tail") == ("", True)
    assert matcher.matched == "</end>"
    assert matcher.push("more") == ("", True)


def test_earliest_match_wins_across_stop_strings() -> None:
    matcher = StopStringMatcher(["world", "lo w"])
    assert matcher.push("hello world") == ("hel", True)
    assert matcher.matched == "lo w"
