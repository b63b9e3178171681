"""The seed graphs compile under every placement and preset; golden `explain` reports.

Regenerate the golden files with `MSTAR_UPDATE_GOLDEN=1 pytest tests/compiler/test_graphs.py`
and read the diff by eye.
"""
from __future__ import annotations

import os

import pytest

from compiler_helpers import HERE, REPO
from mstar_compiler.explain import explain
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file
from mstar_compiler.units import parse_size

GRAPHS = {
    "bagel": ["single", "cfg_parallel"],
    "qwen3_omni": ["single", "thinker_talker"],
    "orpheus": ["single", "disaggregated", "tp2"],
    "vjepa2_ac": ["single"],
    "smollm2": ["single", "replicas"],
    "voice_agent": ["split", "single"],
    "whisper": ["single"],
    "zimage": ["single"],
    "pi05": ["single"],
}
FULL = {"bagel": "bagel-7b", "qwen3_omni": "qwen3-omni-30b-a3b", "orpheus": "orpheus-3b",
        "vjepa2_ac": "vitg", "smollm2": "smollm2-135m", "voice_agent": "published", "whisper": "large-v3",
        "zimage": "turbo", "pi05": "pi05-base"}
CASES = [(g, p) for g, ps in GRAPHS.items() for p in ps]


def _compile(graph: str, **options):
    return compile_file(str(REPO / "graphs" / f"{graph}.yaml"), Options(**options), verify=True)


@pytest.mark.parametrize("graph,placement", CASES)
def test_tiny_and_full_presets_compile(graph, placement):
    tiny = _compile(graph, placement=placement, preset="tiny").plan
    full = _compile(graph, placement=placement, preset=FULL[graph]).plan
    assert tiny.preset == "tiny" and full.preset == FULL[graph]
    assert sum(r.weight_bytes for r in full.ranks) > 50 * sum(r.weight_bytes for r in tiny.ranks)


@pytest.mark.parametrize("graph,placement", CASES)
def test_golden_explain(graph, placement):
    report = explain(_compile(graph, placement=placement, preset="tiny").plan)
    path = HERE / "golden" / f"{graph}-{placement}.txt"
    if os.environ.get("MSTAR_UPDATE_GOLDEN"):
        path.write_text(report)
    assert report == path.read_text()


def test_bagel_full_size_weights_match_published_parameter_count():
    p = _compile("bagel", preset="bagel-7b", placement="single", device_memory=parse_size("80GiB")).plan
    (rank,) = p.ranks
    assert rank.memory_bytes == 80 * 2**30
    params_on_rank = rank.weight_bytes / 2                     # bf16
    # the published "14B", a figure rounded to the billion: the plan's weights are 13.31B (measured), 4.9% under it
    assert abs(params_on_rank - 14e9) / 14e9 < 0.05
    report = explain(p)
    assert f"weights {rank.weight_bytes / 2**30:.1f} GiB" in report
    cfg = _compile("bagel", preset="bagel-7b", placement="cfg_parallel").plan
    assert [r.weight_bytes // 2 // 10**9 for r in cfg.ranks] == [14, 14, 14]   # the LLM weights on every rank


def test_one_bagel_config_serves_four_tasks():
    p = _compile("bagel").plan
    assert {t.name for t in p.tasks} == {"chat", "i2t", "t2i", "i2i"}


def test_placements_required_by_the_issue():
    assert _compile("qwen3_omni", placement="thinker_talker").plan.node("talker").placement.ranks == [1]
    orpheus = _compile("orpheus", placement="tp2").plan.node("lm").placement
    assert (orpheus.ranks, orpheus.tp_size) == ([0, 1], 2)
    pd = _compile("orpheus", placement="disaggregated").plan.node("lm").placement
    assert pd.walk_ranks == {"talk": [1]}


def test_full_orpheus_does_not_fit_a_small_device():
    from mstar_compiler.errors import CompileError
    with pytest.raises(CompileError, match="model does not fit: rank 0 holds"):
        _compile("orpheus", preset="orpheus-3b", device_memory=parse_size("4GiB"))


def test_plugin_kind_compiles():
    p = compile_file(str(HERE / "graphs" / "plugin_tts.yaml"), verify=True).plan
    louder = p.node("louder")
    assert louder.kind == "audio_gain" and louder.num_params == 1 and louder.param_args == {"initial_gain": "gain"}
    assert ("snac", "audio", "louder", "audio") in {(e.src_node, e.src_port, e.dst_node, e.dst_port) for e in p.edges}


def test_schema_is_valid_2020_12_and_graphs_point_at_it():
    import json

    import jsonschema

    schema = json.loads((REPO / "schemas" / "walk_graph.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    for graph in GRAPHS:
        first = (REPO / "graphs" / f"{graph}.yaml").read_text().splitlines()[0]
        assert first == "# yaml-language-server: $schema=../schemas/walk_graph.schema.json"


@pytest.mark.parametrize("placement", GRAPHS["bagel"])
def test_bagel_bench_mid_preset_compiles(placement):
    """The benchmark preset: a 6 x 512 LM (the ViT's connector at its width), tiny VAE and CFG."""
    p = _compile("bagel", placement=placement, preset="bench-mid").plan
    llm, vit = p.node("llm"), p.node("vit")
    assert (llm.preset, llm.dims["num_hidden_layers"], llm.dims["hidden_size"]) == ("bench-mid", 6, 512)
    assert vit.dims["llm_hidden_size"] == llm.dims["hidden_size"]
    assert p.node("vae_dec").preset == "tiny"
    assert [r.weight_bytes > 100 * 2**20 for r in p.ranks] == [True] * len(p.ranks)   # the fp32 LM on every rank


@pytest.mark.parametrize("preset,window", [("tiny", 200), ("qwen3-omni-30b-a3b", 800)])
def test_realtime_audio_is_a_client_fed_stream_cut_in_encoder_windows(preset, window):
    """Qwen3-Omni's realtime input: a stream whose producer is the client, cut by `fixed: <the
    encoder's attention window>` (the tiny preset sets its own), consumed per chunk by `listen`."""
    plan = _compile("qwen3_omni", placement="thinker_talker", preset=preset).plan
    stream = next(s for s in plan.streams if s.name == "user_audio")
    assert stream.is_client_fed and (stream.src_node, stream.src_port, stream.src_rank) == ("client", "mel", -1)
    assert (stream.dst_node, stream.dst_port, stream.dst_rank) == ("audio_enc", "mel", 0)
    assert (stream.policy.kind, stream.policy.size, stream.capacity) == ("fixed", window, 2 * window)
    assert window == plan.node("audio_enc").dims["n_window_infer"]
    assert [t.per_chunk for t in plan.task("listen").tracks] == ["user_audio"]
    assert not [t for t in plan.transfers if t.kind == "stream" and t.dst_node == "audio_enc"]   # no worker sends it
    assert [s.name for s in plan.streams if s.is_client_fed] == ["user_audio", "user_pcm"]
    # the session's audio for the voice activity detector: 16 kHz windows of 512, each released as it arrives
    pcm = next(s for s in plan.streams if s.name == "user_pcm")
    assert (pcm.src_node, pcm.src_port, pcm.dst_node, pcm.dst_port) == ("client", "pcm", "vad", "pcm")
    assert (pcm.policy.kind, pcm.policy.size) == ("fixed", 1)
    assert [t.per_chunk for t in plan.task("detect_speech").tracks] == ["user_pcm"]
