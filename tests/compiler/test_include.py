"""`include:`: graph files compiled into one graph under a name (mstar_compiler/passes/include.py).

Every graph is written into `tmp_path`, next to copies of the seed graphs it includes, so include paths
are relative to the including file. The oracle for a composed plan is each included graph compiled alone.
"""
from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from compiler_helpers import REPO
from mstar_compiler import plan
from mstar_compiler.errors import CompileError
from mstar_compiler.explain import explain
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import Compiled, compile_file
from mstar_compiler.units import parse_size

PAIR = """
    mstar: 1
    model: pair
    include:
      llm: {graph: smollm2.yaml, preset: tiny}
      tts: {graph: orpheus.yaml, preset: tiny}
"""


def _write(folder: Path, name: str, *texts: str) -> Path:
    """`texts`, each dedented, one after the other as the graph file `folder/name` (the first's first line is
    line 1); the seed graphs beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    for seed in ("smollm2.yaml", "orpheus.yaml"):
        shutil.copyfile(REPO / "graphs" / seed, folder / seed)
    path = folder / name
    path.write_text("".join(textwrap.dedent(text).lstrip("\n") for text in texts))
    return path


def _compile(path: Path, **options) -> Compiled:
    return compile_file(str(path), Options(**options), verify=True)


def _error(path: Path, **options) -> CompileError:
    with pytest.raises(CompileError) as info:
        _compile(path, **options)
    return info.value


def _alone(tmp_path: Path, graph: str, preset: str = "tiny") -> plan.Plan:
    """The oracle: a seed graph (copied into tmp_path) compiled on its own."""
    return _compile(tmp_path / f"{graph}.yaml", preset=preset).plan


def _prefixed(prefix: str, names: list[str]) -> list[str]:
    return [f"{prefix}.{name}" for name in names]


# ---------------------------------------------------------------- two seed graphs, nothing of its own


def test_every_included_name_is_prefixed_with_its_include(tmp_path: Path) -> None:
    p = _compile(_write(tmp_path, "pair.yaml", PAIR)).plan
    llm, tts = _alone(tmp_path, "smollm2"), _alone(tmp_path, "orpheus")

    def names(q: plan.Plan, field: str) -> list[str]:
        return [x.name for x in getattr(q, field)]

    for field in ("nodes", "walks", "tasks", "params", "streams", "task_streams"):
        assert names(p, field) == _prefixed("llm", names(llm, field)) + _prefixed("tts", names(tts, field)), field
    assert names(p, "nodes") == ["llm.lm", "tts.lm", "tts.snac"]
    assert p.walk("tts.talk").program[0].max == plan.Count(param="tts.max_tokens")
    assert p.task("tts.speech").tracks[1].per_chunk == "tts.audio_tokens"
    stream = p.streams[0]
    assert (stream.src_node, stream.dst_node) == ("tts.lm", "tts.snac")
    assert p.task_streams[0].task == "tts.speech"


def test_included_nodes_and_params_equal_their_graphs_compiled_alone(tmp_path: Path) -> None:
    p = _compile(_write(tmp_path, "pair.yaml", PAIR)).plan
    for prefix, graph in (("llm", "smollm2"), ("tts", "orpheus")):
        alone = _alone(tmp_path, graph)
        for node in alone.nodes:
            got = p.node(f"{prefix}.{node.name}")
            assert (got.kind, got.preset, got.dims, got.dtype) == (node.kind, node.preset, node.dims, node.dtype)
            assert (got.num_params, got.weight_bytes, got.source) == (node.num_params, node.weight_bytes, node.source)
            assert got.weight_key == f"{prefix}.{node.weight_key}" and got.random_weights
        for param in alone.params:
            got = next(q for q in p.params if q.name == f"{prefix}.{param.name}")
            assert (got.default, got.minimum, got.maximum) == (param.default, param.minimum, param.maximum)
    assert p.node("llm.lm").source == "smollm2.yaml:32:3"            # the included file's line, not pair.yaml's
    assert next(q for q in p.params if q.name == "tts.max_tokens").default == 70   # orpheus' tiny preset


def test_models_default_task_and_device_memory_come_from_the_includes(tmp_path: Path) -> None:
    p = _compile(_write(tmp_path, "pair.yaml", PAIR)).plan
    assert p.models == [
        plan.IncludedModel(name="llm", model="smollm2-135m-instruct", source="smollm2.yaml", preset="tiny",
                           placement="single", default_task="llm.chat"),
        plan.IncludedModel(name="tts", model="orpheus-3b", source="orpheus.yaml", preset="tiny",
                           placement="single", default_task="tts.speech"),
    ]
    assert (p.model, p.source, p.default_task) == ("pair", "pair.yaml", "llm.chat")
    (rank,) = p.ranks
    assert rank.memory_bytes == parse_size("64MiB") + parse_size("256MiB")   # the two tiny presets' device_memory
    assert rank.nodes == ["llm.lm", "tts.lm", "tts.snac"]
    swapped = _write(tmp_path, "swapped.yaml", """
        mstar: 1
        model: swapped
        include:
          tts: {graph: orpheus.yaml, preset: tiny}
          llm: smollm2.yaml
    """)
    q = _compile(swapped).plan
    assert q.default_task == "tts.speech" and [m.name for m in q.models] == ["tts", "llm"]
    assert q.models[1].preset == "smollm2-135m"                      # a plain path: the include's default preset


def test_the_composed_plan_round_trips_through_plan_bin(tmp_path: Path) -> None:
    compiled = _compile(_write(tmp_path / "here", "pair.yaml", PAIR))
    assert compiled.data == plan.dump_plan(compiled.plan)
    (tmp_path / "pair.plan.bin").write_bytes(compiled.data)
    loaded = plan.load_plan(tmp_path / "pair.plan.bin")
    assert loaded == compiled.plan and loaded.models == compiled.plan.models
    there = shutil.copytree(tmp_path / "here", tmp_path / "there")
    assert _compile(there / "pair.yaml").data == compiled.data       # the plan records no directory


def test_explain_shows_each_models_share(tmp_path: Path) -> None:
    report = explain(_compile(_write(tmp_path, "pair.yaml", PAIR)).plan)
    lines = report.splitlines()
    at = lines.index("models: 2 included")
    assert lines[at + 1] == ("  llm: smollm2-135m-instruct (from smollm2.yaml, preset tiny, placement single), "
                             "1 node, default task llm.chat")
    assert lines[at + 2].startswith("    rank 0: weights 545.2 KiB, KV ")
    assert lines[at + 3] == ("  tts: orpheus-3b (from orpheus.yaml, preset tiny, placement single), "
                             "2 nodes, default task tts.speech")
    assert lines[at + 4].startswith("    rank 0: weights 39.0 MiB, KV ")
    assert lines.index("ranks: 1") > at + 4
    assert "models:" not in explain(_alone(tmp_path, "smollm2"))


# ---------------------------------------------------------------- the including graph's own parts


def test_own_walks_tasks_and_streams_join_the_included_ones(tmp_path: Path) -> None:
    path = _write(tmp_path, "own.yaml", PAIR, """
        nodes:
          voc: {kind: snac_decoder, batch: 4}
        streams:
          spoken: {from: tts.lm.token, to: voc.codes, policy: {sliding: {window: 28, stride: 7}}}
        walks:
          answer: {until: [eos], max: $llm.max_tokens, do: llm.lm, carry: {llm.lm.token: llm.lm.tokens}}
          both_halves: [llm.prefill, llm.decode]
          say: [voc]
        tasks:
          talk: [llm.prefill, answer]
          recite:
            tracks:
              lm: [tts.read, tts.talk]
              vocoder: {per_chunk: spoken, do: say}
    """)
    p = _compile(path).plan
    assert [n.name for n in p.nodes] == ["llm.lm", "tts.lm", "tts.snac", "voc"]
    assert [t.name for t in p.tasks] == ["llm.chat", "tts.speech", "talk", "recite"]
    assert p.default_task == "talk"                                  # its own first task wins over the includes'
    assert [s.walk for s in p.task("talk").tracks[0].states] == ["llm.prefill", "answer"]
    loop = p.walk("answer").program[0]
    assert isinstance(loop, plan.DynamicLoopBegin) and loop.max == plan.Count(param="llm.max_tokens")
    assert loop.until == [plan.ExitCond(kind="eos", node="llm.lm", port="token")]
    assert loop.carries == [plan.Carry("llm.lm", "token", "llm.lm", "tokens")]
    runs = [op.node for op in plan.program_runs(p.walk("both_halves").program)]
    assert runs == ["llm.lm", "llm.lm"] and isinstance(p.walk("both_halves").program[1], plan.DynamicLoopBegin)
    spoken = next(s for s in p.streams if s.name == "spoken")
    assert (spoken.src_node, spoken.src_port, spoken.dst_node, spoken.dst_port) == ("tts.lm", "token", "voc", "codes")
    recite = p.task("recite").tracks
    assert [s.walk for s in recite[0].states] == ["tts.read", "tts.talk"] and recite[1].per_chunk == "spoken"
    assert p.node("voc").source == "own.yaml:7:3"


# ---------------------------------------------------------------- placement


def test_a_whole_include_placed_by_its_name(tmp_path: Path) -> None:
    path = _write(tmp_path, "split.yaml", PAIR, """
        placements:
          split: {"*": 0, "tts.*": 1}
    """)
    p = _compile(path, placement="split").plan
    assert {n.name: n.placement.ranks for n in p.nodes} == {"llm.lm": [0], "tts.lm": [1], "tts.snac": [1]}
    assert [r.nodes for r in p.ranks] == [["llm.lm"], ["tts.lm", "tts.snac"]]
    assert [r.memory_bytes for r in p.ranks] == [parse_size("320MiB")] * 2
    assert p.placement == "split"


def test_an_included_node_placed_by_its_full_name(tmp_path: Path) -> None:
    path = _write(tmp_path, "exact.yaml", PAIR, """
        placements:
          exact: {"*": 0, llm.lm: 1}
    """)
    p = _compile(path, placement="exact").plan
    assert {n.name: n.placement.ranks for n in p.nodes} == {"llm.lm": [1], "tts.lm": [0], "tts.snac": [0]}
    assert len(p.ranks) == 2


def test_an_includes_own_profile_places_its_nodes(tmp_path: Path) -> None:
    path = _write(tmp_path, "own_profiles.yaml", """
        mstar: 1
        model: pair
        include:
          llm: {graph: smollm2.yaml, preset: tiny, placement: replicas}
          tts: {graph: orpheus.yaml, preset: tiny, placement: disaggregated}
    """)
    p = _compile(path).plan
    assert p.node("llm.lm").placement == plan.Placement(ranks=[0, 1])                    # smollm2's `replicas`
    assert p.node("tts.lm").placement == plan.Placement(ranks=[0], walk_ranks={"tts.talk": [1]})
    assert p.node("tts.snac").placement.ranks == [1]
    assert [m.placement for m in p.models] == ["replicas", "disaggregated"]
    assert [r.nodes for r in p.ranks] == [["llm.lm", "tts.lm"], ["llm.lm", "tts.lm", "tts.snac"]]


# ---------------------------------------------------------------- presets


def test_a_top_preset_chooses_an_includes_preset(tmp_path: Path) -> None:
    path = _write(tmp_path, "presets.yaml", PAIR, """
        presets:
          tiny: {}
          half: {include: {llm: tiny-bf16}}
          roomy: {device_memory: 1GiB, include: {llm: tiny-bf16}}
    """)
    tiny, half, roomy = (_compile(path, preset=name).plan for name in ("tiny", "half", "roomy"))
    bf16 = _alone(tmp_path, "smollm2", preset="tiny-bf16").node("lm")
    assert tiny.node("llm.lm").dtype == "fp32" and tiny.models[0].preset == "tiny"
    assert half.preset == "half" and half.models[0].preset == "tiny-bf16"
    assert (half.node("llm.lm").dtype, half.node("llm.lm").weight_bytes) == ("bf16", bf16.weight_bytes)
    for name in ("tts.lm", "tts.snac"):                               # the other include keeps its preset
        assert (half.node(name).dtype, half.node(name).dims) == (tiny.node(name).dtype, tiny.node(name).dims)
    assert half.models[1] == tiny.models[1]
    assert half.ranks[0].memory_bytes == parse_size("320MiB")
    assert roomy.ranks[0].memory_bytes == parse_size("1GiB")         # its own device_memory wins over the sum


def test_a_top_preset_sets_an_included_param_within_its_bounds(tmp_path: Path) -> None:
    path = _write(tmp_path, "param.yaml", PAIR, """
        presets:
          short: {params: {llm.max_tokens: 5}}
          long: {params: {llm.max_tokens: 9000}}
    """)
    p = _compile(path, preset="short").plan
    assert next(q for q in p.params if q.name == "llm.max_tokens").default == 5
    assert next(q for q in p.params if q.name == "tts.max_tokens").default == 70     # orpheus' own, untouched
    err = _error(path, preset="long")
    assert "above the maximum 8192 of param 'llm.max_tokens'" in err.message


# ---------------------------------------------------------------- nesting


def test_nested_includes_prefix_twice(tmp_path: Path) -> None:
    _write(tmp_path / "sub", "a.yaml", """
        mstar: 1
        model: amodel
        include:
          b: {graph: smollm2.yaml, preset: tiny}
        tasks:
          ask: [b.prefill, b.decode]
    """)
    top = _write(tmp_path, "top.yaml", """
        mstar: 1
        model: top
        include:
          a: sub/a.yaml
        placements:
          single: {"*": 0}
          moved: {"*": 0, "a.*": 1}
    """)
    p = _compile(top).plan
    assert [n.name for n in p.nodes] == ["a.b.lm"]
    assert [w.name for w in p.walks] == ["a.b.prefill", "a.b.decode"]
    assert [t.name for t in p.tasks] == ["a.b.chat", "a.ask"]
    assert [q.name for q in p.params][:2] == ["a.b.max_tokens", "a.b.temperature"]
    assert [s.walk for s in p.task("a.ask").tracks[0].states] == ["a.b.prefill", "a.b.decode"]
    assert p.models == [
        plan.IncludedModel(name="a.b", model="smollm2-135m-instruct", source="smollm2.yaml", preset="tiny",
                           placement="single", default_task="a.b.chat"),
        plan.IncludedModel(name="a", model="amodel", source="a.yaml", preset="", placement="single",
                           default_task="a.ask"),
    ]
    assert p.default_task == "a.ask" and p.ranks[0].memory_bytes == parse_size("64MiB")
    assert p.node("a.b.lm").dims == _alone(tmp_path / "sub", "smollm2").node("lm").dims
    assert _compile(top, placement="moved").plan.node("a.b.lm").placement.ranks == [1]
    assert "  a.b: smollm2-135m-instruct (from smollm2.yaml" in explain(p)


# ---------------------------------------------------------------- errors name the file they are in

BAD_KIND = """
    mstar: 1
    model: inner
    nodes:
      lm: {kind: lama_lm}
    walks:
      w: [lm]
    tasks:
      t: [w]
"""
BAD_WALK = """
    mstar: 1
    model: inner
    nodes:
      vit: {kind: siglip_vit}
      dec: {kind: vae_decoder}
    walks:
      w: [vit, dec]
    tasks:
      t: [w]
"""
BAD_TP = """
    mstar: 1
    model: inner
    nodes:
      lm: {kind: llama_lm}
    walks:
      w: [lm]
    tasks:
      t: [w]
    placements:
      tp3: {lm: {ranks: [0, 1, 2], tp: 3}}
"""
INCLUDE_INNER = """
    mstar: 1
    model: top
    include:
      inner: {graph: inner.yaml, placement: PLACEMENT}
"""


@pytest.mark.parametrize("inner,placement,where,message,path", [
    (BAD_KIND, "single", (4, 14), "unknown component kind 'lama_lm'", ("nodes", "lm", "kind")),       # resolve
    (BAD_WALK, "single", (7, 12), "in walk 'inner.w', no output of 'inner.vit'", ("walks", "w", 1)),  # typecheck
    (BAD_TP, "tp3", (10, 36), "tp size 3 does not divide num_attention_heads = 4 of node 'inner.lm'",
     ("placements", "tp3", "lm", "tp")),                                                                 # place
], ids=["resolve", "typecheck", "place"])
def test_an_error_in_an_included_file_names_that_files_line(tmp_path: Path, inner: str, placement: str,
                                                             where: tuple[int, int], message: str,
                                                             path: tuple) -> None:
    inner_path = _write(tmp_path, "inner.yaml", inner)
    top = _write(tmp_path, "top.yaml", INCLUDE_INNER.replace("PLACEMENT", placement))
    err = _error(top)
    assert err.position.file == str(inner_path)
    assert (err.position.line, err.position.column) == where, str(err)
    assert message in err.message and err.path == path


def test_an_error_two_includes_down_names_the_innermost_file(tmp_path: Path) -> None:
    inner_path = _write(tmp_path / "sub", "inner.yaml", BAD_WALK)
    mid = INCLUDE_INNER.replace("PLACEMENT", "single").replace("model: top", "model: mid")    # names differ
    _write(tmp_path / "sub", "mid.yaml", mid)
    top = _write(tmp_path, "top.yaml", """
        mstar: 1
        model: top
        include:
          mid: sub/mid.yaml
    """)
    err = _error(top)
    assert (err.position.file, err.position.line, err.position.column) == (str(inner_path), 7, 12)
    assert "in walk 'mid.inner.w'" in err.message and err.path == ("walks", "w", 1)


EDGES = """
    mstar: 1
    model: inner
    nodes:
      vit: {kind: siglip_vit}
      lm: {kind: llama_lm}
      lm2: {kind: llama_lm}
    edges:
      - vit.hidden -> lm2.embeds
    walks:
      w: [vit, lm, lm2]
    tasks:
      t: [w]
"""


def test_an_included_graphs_declared_edges_are_kept(tmp_path: Path) -> None:
    _write(tmp_path, "inner.yaml", EDGES)
    top = _write(tmp_path, "top.yaml", INCLUDE_INNER.replace("PLACEMENT", "single"))
    alone = {(e.walk, e.src_node, e.src_port, e.dst_node, e.dst_port, e.is_implied)
             for e in _compile(tmp_path / "inner.yaml").plan.edges}
    assert ("w", "vit", "hidden", "lm2", "embeds", False) in alone
    composed = {(e.walk, e.src_node, e.src_port, e.dst_node, e.dst_port, e.is_implied)
                for e in _compile(top).plan.edges}
    assert composed == {(f"inner.{w}", f"inner.{s}", sp, f"inner.{d}", dp, i) for w, s, sp, d, dp, i in alone}


def test_an_included_graphs_mistyped_edge_is_an_error_in_its_file(tmp_path: Path) -> None:
    inner_path = _write(tmp_path, "inner.yaml", EDGES.replace("vit.hidden -> lm2.embeds", "vit.hidden -> lm2.tokens"))
    assert "type mismatch" in _error(inner_path).message
    err = _error(_write(tmp_path, "top.yaml", INCLUDE_INNER.replace("PLACEMENT", "single")))
    assert (err.position.file, err.position.line, err.position.column) == (str(inner_path), 8, 5)
    assert "type mismatch: inner.vit.hidden is hidden, inner.lm2.tokens expects tokens" in err.message


def test_an_include_cycle_is_reported_at_the_include_that_closes_it(tmp_path: Path) -> None:
    a = _write(tmp_path, "cyc_a.yaml", """
        mstar: 1
        model: a
        include:
          other: cyc_b.yaml
    """)
    b = _write(tmp_path, "cyc_b.yaml", """
        mstar: 1
        model: b
        include:
          back: {graph: cyc_a.yaml}
    """)
    err = _error(a)
    assert (err.position.file, err.position.line, err.position.column) == (str(b), 4, 17)
    assert err.message == "include cycle: cyc_a.yaml -> cyc_b.yaml -> cyc_a.yaml"
    assert err.path == ("include", "back", "graph")


@pytest.mark.parametrize("entry,where,message", [
    ("llm: {graph: nothere.yaml}", (4, 8), "include 'llm': no graph file "),
    ("llm: {graph: smollm2.yaml, preset: tinny}", (4, 38), "smollm2.yaml has no graph preset 'tinny'"),
    ("llm: {graph: smollm2.yaml, preset: tiny, placement: nope}", (4, 55),
     "smollm2.yaml has no placement profile 'nope'"),
], ids=["missing_file", "unknown_preset", "unknown_placement"])
def test_a_bad_include_entry_is_an_error_in_the_including_file(tmp_path: Path, entry: str,
                                                               where: tuple[int, int], message: str) -> None:
    top = _write(tmp_path, "top.yaml", f"mstar: 1\nmodel: top\ninclude:\n  {entry}\n")
    err = _error(top)
    assert (err.position.file, err.position.line, err.position.column) == (str(top), *where), str(err)
    assert message in err.message


def test_a_placement_naming_an_unknown_include_is_an_error(tmp_path: Path) -> None:
    top = _write(tmp_path, "top.yaml", PAIR, """
        placements:
          p: {"*": 0, "zz.*": 1}
    """)
    err = _error(top, placement="p")
    assert (err.position.file, err.position.line, err.position.column) == (str(top), 7, 15), str(err)
    assert err.message == "placement 'p' places unknown node 'zz.*'"
    assert "'llm.*'" in err.hint and "'tts.*'" in err.hint


def test_the_plans_digest_follows_an_edit_to_an_included_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "pair.yaml", PAIR)
    before = _compile(path).plan.source_sha256
    smollm2 = tmp_path / "smollm2.yaml"
    smollm2.write_text(smollm2.read_text().replace("doc: SmolLM2-135M-Instruct chat model", "doc: edited"))
    after = _compile(path).plan.source_sha256
    assert before != after and len(after) == 64
