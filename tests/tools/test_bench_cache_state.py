"""The cache-state rule of the served comparisons: a row compares sides whose prefix caches were in the same,
stated state (cold: off everywhere, nothing reused; warm: on everywhere, its reuse recorded), or it is refused.
Synthetic states and counters: no servers."""
from __future__ import annotations

import pytest

from bench import cache_state
from bench.cache_state import COLD, WARM, CacheMismatch, CacheState
from bench.peers import Peer, measured, prometheus_total
from bench.registry import Context, Needs

OFF = CacheState(False, 800, 0, "test")
HIT = CacheState(True, 800, 640, "test")
MISSED = CacheState(True, 800, 0, "test")


def test_the_words_of_a_cache_state():
    assert (OFF.word, HIT.word, MISSED.word) == ("off", "on", "on")
    assert CacheState(False, 800, 16, "test").word == "off-but-hit"      # its own counters contradict its flag
    assert HIT.to_dict() == {"is_enabled": True, "query_tokens": 800, "hit_tokens": 640, "source": "test", "state": "on"}


def test_sides_in_their_modes_state_pass_and_a_warm_rows_reuse_is_said():
    cache_state.require_same("cold row", COLD, {"mstar": [OFF, OFF], "vllm": [OFF, OFF]})
    warm = {"mstar": [HIT, HIT], "vllm": [MISSED, MISSED]}     # on everywhere; vLLM's blocks outsize the prompts
    cache_state.require_same("warm row", WARM, warm)
    assert cache_state.reuse_note(warm) == "mstar reused 1280 of 1600 prompt tokens; vllm reused 0 of 1600 prompt tokens"


@pytest.mark.parametrize(("mode", "a", "b"), [
    (COLD, OFF, HIT),                            # one side's cache on in a cold row
    (COLD, OFF, CacheState(False, 8, 8, "t")),   # one side says off, yet its counters reused tokens
    (WARM, HIT, OFF),                            # one side ran with its cache off in a warm row
])
def test_a_row_whose_sides_caches_differ_is_refused(mode, a, b):
    with pytest.raises(CacheMismatch, match="round 2") as refused:
        cache_state.require_same("row", mode, {"mstar": [a, a], "peer": [a, b]})
    assert "mstar" in str(refused.value) and "peer" in str(refused.value)
    assert isinstance(refused.value, Needs)     # recorded where the row would have been


def test_sides_that_agree_but_not_with_the_mode_are_refused_too():
    with pytest.raises(CacheMismatch, match="need every side's prefix cache off"):
        cache_state.require_same("row", COLD, {"mstar": [MISSED], "vllm": [MISSED]})
    with pytest.raises(CacheMismatch, match="need every side's prefix cache on"):
        cache_state.require_same("row", WARM, {"mstar": [OFF], "vllm": [OFF]})
    with pytest.raises(CacheMismatch, match="numbers of rounds"):
        cache_state.require_same("row", COLD, {"mstar": [OFF, OFF], "vllm": [OFF]})
    with pytest.raises(ValueError):
        cache_state.require_same("row", "tepid", {"mstar": [OFF]})


def test_a_run_carries_the_counters_it_moved_and_the_states_come_from_its_samples():
    seen = iter([(100, 10), (180, 10), (180, 10), (300, 90)])
    run = measured(lambda: next(seen), lambda: {"tok_s": 5.0})
    samples: dict[str, list[float]] = {}
    for _ in range(2):
        for key, value in run().items():
            samples.setdefault(key, []).append(value)
    assert samples == {"tok_s": [5.0, 5.0], "cache_query_tokens": [80, 120], "cache_hit_tokens": [0, 80]}
    states = cache_state.from_samples(True, "src", samples)
    assert [s.word for s in states] == ["on", "on"] and [s.hit_tokens for s in states] == [0, 80]


def test_counters_are_read_from_prometheus_text_with_labels_and_totals():
    text = ("# HELP vllm:prefix_cache_queries Prefix cache queries\n# TYPE vllm:prefix_cache_queries counter\n"
            'vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 812.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 0.0\n'
            'mstar_prefix_cache_hit_tokens_total{node="lm",rank="0"} 16.0\n'
            'mstar_prefix_cache_hit_tokens_total{node="lm",rank="1"} 32.0\n'
            "llamacpp:prompt_tokens_total 400\nllamacpp:prompt_tokens_cached_total 12\n")
    assert prometheus_total(text, "vllm:prefix_cache_queries") == 812
    assert prometheus_total(text, "mstar_prefix_cache_hit_tokens") == 48
    assert prometheus_total(text, "llamacpp:prompt_tokens") == 400          # not the _cached_ counter
    assert prometheus_total(text, "llamacpp:prompt_tokens_cached") == 12
    assert prometheus_total(text, "mstar_prefix_cache_query_tokens") == 0    # absent: a side with its cache off


def _records(**enabled: bool) -> dict:
    return {name: {"label": f"{name} label", "cache_enabled": on, "cache_source": f"{name} counters"}
            for name, on in enabled.items()}


def _samples(hits: int) -> dict[str, list[float]]:
    return {"tok_s": [100.0, 110.0], "p50_e2e": [1.0, 1.1], "p95_e2e": [2.0, 2.1], "p50_ttft": [0.1, 0.1],
            "cache_query_tokens": [800, 800], "cache_hit_tokens": [0, hits]}


def test_the_chat_suite_publishes_no_row_whose_sides_caches_differ(tmp_path):
    """mstar and llama.cpp both cold; vLLM's counters say it reused tokens in round 2: its row is refused and
    said so, llama.cpp's is published; every side's state of every round is in the settings."""
    from bench.suite_chat import _rows

    ctx = Context(rounds=2, quick=True, root=tmp_path)
    samples = {"mstar": _samples(0), "vllm": _samples(16), "llamacpp": _samples(0)}
    rows = _rows(ctx, "float32", COLD, samples, _records(mstar=False, vllm=False, llamacpp=False), 2554)
    assert {r.case for r in rows} == {"float32 cold: mstar vs llamacpp"}
    assert [n["case"] for n in ctx.needs] == ["float32 cold: mstar vs vllm"]
    assert "vllm off-but-hit (16 of 800" in ctx.needs[0]["needs"]
    recorded = ctx.settings["cache_states"]["float32 cold"]
    assert [s["state"] for s in recorded["vllm"]] == ["off", "off-but-hit"]
    assert rows[0].a.label == "mstar label" and rows[0].b.label == "llamacpp label"


def test_the_prefill_suite_publishes_no_row_whose_sides_caches_differ(tmp_path):
    from bench.suite_prefill import _rows

    def peer(name: str, enabled: bool) -> Peer:
        return Peer(name, f"{name} label", None, "smollm2", enabled, f"{name} counters", lambda: (0, 0))

    ctx = Context(rounds=2, quick=True, root=tmp_path)
    samples = {name: {"ttft": [0.5, 0.6], "cache_query_tokens": [300, 300], "cache_hit_tokens": [0, 0]}
               for name in ("mstar", "vllm", "llamacpp")}
    peers = {"mstar": peer("mstar", False), "vllm": peer("vllm", True), "llamacpp": peer("llamacpp", False)}
    rows = _rows(ctx, "256 tokens alone", peers, samples)
    assert [(r.case, r.names) for r in rows] == [("256 tokens alone (cold)", ("mstar", "llamacpp"))]
    assert ctx.needs[0]["case"] == "256 tokens alone cold: mstar vs vllm" and "vllm on (0 of 300" in ctx.needs[0]["needs"]


def test_a_warm_chat_row_says_what_each_side_reused(tmp_path):
    from bench.suite_chat import _rows

    ctx = Context(rounds=2, quick=True, root=tmp_path)
    samples = {"mstar": _samples(16), "vllm": _samples(0)}
    rows = _rows(ctx, "float32", WARM, samples, _records(mstar=True, vllm=True), 2554)
    assert {r.case for r in rows} == {"float32 warm: mstar vs vllm"} and not ctx.needs
    assert rows[0].note.endswith("warm caches: mstar reused 16 of 1600 prompt tokens; vllm reused 0 of 1600 prompt tokens")
    refused = Context(rounds=2, quick=True, root=tmp_path)
    assert _rows(refused, "float32", WARM, samples, _records(mstar=True, vllm=False), 2554) == []
    assert "need every side's prefix cache on" in refused.needs[0]["needs"]
