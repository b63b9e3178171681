"""The speech suite's listener: underruns from synthetic chunk arrivals, and the summary row."""
from __future__ import annotations

import pytest

from bench.playback import held_in_real_time, underruns
from bench.speech_load import SpeechBurst, StreamResult, listener_metrics
from bench.suite_speech import MODELS, _rows, held_per_round

RATE = 24000


def test_chunks_that_arrive_before_the_buffer_runs_dry_play_without_a_gap() -> None:
    # 1 s chunks; each arrives while the one before is still playing (or exactly as it ends)
    assert underruns([0.0, 0.5, 2.0, 2.1], [1.0, 1.0, 1.0, 1.0]) == []


def test_a_late_chunk_is_an_underrun_and_playback_resumes_from_it() -> None:
    # played until 1.0; chunk 2 at 1.5 is 0.5 s late and plays to 2.5; chunk 3 at 3.5 is 1.0 s late;
    # chunk 4 at 4.0 arrives while chunk 3 plays (until 4.5): no gap
    late = underruns([0.0, 1.5, 3.5, 4.0], [1.0, 1.0, 1.0, 1.0])
    assert late == pytest.approx([0.5, 1.0], abs=1e-12)   # float sums of exact binary fractions


def test_waiting_for_the_first_chunk_is_not_an_underrun() -> None:
    assert underruns([30.0], [0.1]) == [] and underruns([], []) == []


def test_one_duration_per_arrival_is_required() -> None:
    with pytest.raises(ValueError, match="one of each per chunk"):
        underruns([0.0, 1.0], [1.0])


def test_held_in_real_time_is_the_largest_n_below_which_nothing_underran() -> None:
    assert held_in_real_time({8: 0, 16: 0, 32: 0}) == 32
    assert held_in_real_time({32: 3, 8: 0, 16: 0}) == 16            # order of the mapping does not matter
    assert held_in_real_time({8: 0, 16: 2, 32: 0}) == 8             # a clean 32 after a gapped 16 is luck
    assert held_in_real_time({8: 1, 16: 0, 32: 0}) == 0


def _stream(arrivals: list[float], seconds: list[float]) -> StreamResult:
    return StreamResult(tuple(arrivals), tuple(int(s * RATE) for s in seconds), output_tokens=10)


def test_listener_metrics_count_late_streams_and_sum_their_gaps() -> None:
    burst = SpeechBurst([_stream([0.5, 1.0, 1.5], [1.0, 1.0, 1.0]),     # never late
                         _stream([1.0, 2.5, 4.0], [1.0, 1.0, 1.0]),     # 0.5 + 0.5 s late
                         _stream([2.0, 3.25], [1.0, 0.5])], wall_s=4.0)  # 0.25 s late
    got = listener_metrics(burst, RATE)
    # 0.5 + 0.5 + 0.25: sums of exact binary fractions, exact in float64 (measured); the bound only frees the order
    assert got["underrun_streams"] == 2 and got["underrun_s"] == pytest.approx(1.25, abs=1e-12)
    assert got["ttfa"] == 1.0 and got["audio_s"] == 1.5 and got["median_audio_s"] == 3.0 and got["chunks"] == 2


def test_the_summary_row_holds_each_rounds_largest_gap_free_n() -> None:
    per_n = {n: {"underrun_streams": late, "underrun_s": [0.1 * x for x in late], "ttfa": [0.2, 0.3],
                 "audio_s": [4.0, 4.0], "median_audio_s": [4.5, 4.5], "chunks": [3.0, 3.0]}
             for n, late in {8: [0.0, 0.0], 16: [0.0, 1.0], 32: [4.0, 0.0]}.items()}
    assert held_per_round(per_n) == [16.0, 8.0]
    rows = _rows(MODELS[0], "mstar-run", per_n, "note")
    assert [(r.case, r.metric) for r in rows[:3]] == [("Qwen3-Omni tiny, 8 concurrent", m) for m in (
        "streams with an underrun", "total underrun", "median time to first audio")]
    summary = rows[-1]
    assert len(rows) == 3 * 3 + 1 and summary.metric == "streams held in real time" and summary.b is None
    assert summary.a.samples == [16.0, 8.0] and summary.better == "higher" and summary.a.summary().median == 12.0


def test_every_concurrency_needs_the_same_rounds() -> None:
    with pytest.raises(ValueError, match="same number of rounds"):
        held_per_round({8: {"underrun_streams": [0.0]}, 16: {"underrun_streams": [0.0, 0.0]}})
