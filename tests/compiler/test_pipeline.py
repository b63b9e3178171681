"""What each pass produces for the toy graph (tests/compiler/graphs/toy.yaml)."""
from __future__ import annotations

import json

from compiler_helpers import HERE, compile_toy, toy_catalogue
from mstar_compiler import plan
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import PASSES, compile_file

TOY = (HERE / "graphs" / "toy.yaml").read_text()


def _edges(p: plan.Plan, walk: str) -> set[tuple[str, str, str, str]]:
    return {(e.src_node, e.src_port, e.dst_node, e.dst_port) for e in p.edges if e.walk == walk}


def test_implied_edges_follow_sequential_and_parallel_order():
    p = compile_toy(TOY).plan
    assert _edges(p, "read_image") == {("vit", "embeds", "lm", "embeds")}
    # Parallel branches feed the next node's same-dtype inputs in branch order
    assert _edges(p, "draw") == {("den", "velocity", "cfg", "cond"), ("den_u", "velocity", "cfg", "uncond"),
                                 ("cfg", "latent", "dec", "latent")}
    inputs = {(r.walk, r.node, r.port) for r in p.request_inputs}
    assert ("read_image", "vit", "image") in inputs and ("draw", "den", "latent") in inputs
    assert ("read_image", "lm", "embeds") not in inputs


def test_loops_lower_to_flat_programs():
    p = compile_toy(TOY).plan
    draw = p.walk("draw").program
    assert [type(op).__name__ for op in draw] == ["LoopBegin", "Parallel", "Run", "LoopEnd", "Run"]
    assert draw[0].count == plan.Count(param="steps", offset=-1) and draw[0].end == 3 and draw[3].begin == 0
    assert [c.dst_node for c in draw[0].carries] == ["den", "den_u", "cfg"]
    answer = p.walk("answer").program
    assert isinstance(answer[0], plan.DynamicLoopBegin)
    assert answer[0].until == [plan.ExitCond(kind="eos", node="lm", port="token")]
    assert answer[0].max == plan.Count(param="max_tokens")
    assert answer[0].outputs == [plan.LoopOutput("lm", "token", "each")]


def test_tasks_become_state_tables():
    p = compile_toy(TOY).plan
    t2i = p.task("t2i").tracks[0].states
    assert t2i[0].walk is None and t2i[0].transitions[0].cond == plan.Cond(kind="input", modality="image")
    assert [t.target for t in t2i[0].transitions] == [1, 2]
    assert t2i[1].walk == "read_image" and t2i[2].walk == "draw"
    assert t2i[2].transitions[-1].target == plan.DONE
    i2t = p.task("i2t").tracks[0].states
    assert i2t[0].for_each == {"text": ["read_text"], "image": ["read_image"]}
    speech = p.task("speech").tracks
    assert [t.name for t in speech] == ["lm", "vocoder"] and speech[1].per_chunk == "speech"


def test_params_weights_and_args():
    p = compile_toy(TOY).plan
    steps = next(q for q in p.params if q.name == "steps")
    assert (steps.default, steps.minimum, steps.maximum) == (3, 2, 100)     # tiny preset overrides the default
    lm = p.node("lm")
    assert lm.param_args == {"temperature": "temperature"} and lm.args == {}
    assert p.node("den_u").weight_key == "den" and p.node("cfg").args == {"scale": 4.0}
    assert lm.dims["hidden_size"] == 64 and lm.inputs[1].shape == ["T", 64]


def test_split_placement_transfers_and_per_walk_ranks():
    p = compile_toy(TOY, placement="split").plan
    assert p.walk("answer").program[1] == plan.Run("lm", [1])
    assert p.walk("read_text").program[0] == plan.Run("lm", [0])
    kinds = {(t.kind, t.src_node, t.dst_node, t.src_rank, t.dst_rank) for t in p.transfers}
    assert ("kv", "lm", "lm", 0, 1) in kinds
    assert ("edge", "den_u", "cfg", 1, 0) in kinds and ("carry", "cfg", "den_u", 0, 1) in kinds
    assert [r.nodes for r in p.ranks] == [["vit", "lm", "den", "cfg", "dec"], ["lm", "den_u", "voc"]]


def test_memory_plan_counts_shared_weights_once_and_splits_tp():
    single = compile_toy(TOY).plan
    weights = {n.name: n.weight_bytes for n in single.nodes}
    expected = sum(w for name, w in weights.items() if name != "den_u")      # den_u shares den's weights
    assert single.ranks[0].weight_bytes == expected
    tp = compile_toy(TOY, placement="tp2").plan
    assert tp.ranks[1].weight_bytes == weights["lm"] // 2
    pool = single.node("lm").kv_pools[0]
    kv_per_token = 2 * 2 * 2 * 16 * 4                                        # layers*K,V*kv_heads*head_dim*fp32
    assert pool.block_bytes == 16 * kv_per_token
    budget = 64 * 2**20
    assert single.ranks[0].weight_bytes + pool.num_blocks * pool.block_bytes <= budget * 0.9
    assert pool.num_blocks * pool.block_bytes > budget * 0.8 - single.ranks[0].weight_bytes


def test_capture_regions_and_stream_buffers():
    p = compile_toy(TOY).plan
    regions = {(c.walk, tuple(c.nodes)): c.batch_buckets for c in p.capture_regions}
    assert regions[("answer", ("lm",))] == [1, 2, 4, 8]
    assert regions[("draw", ("den", "den_u", "cfg"))][-1] == 64
    (stream,) = p.streams
    assert stream.policy == plan.ChunkPolicy("sliding", 28, stride=7) and stream.capacity == 35


def test_dump_stages_writes_every_pass(tmp_path):
    compile_file(str(HERE / "graphs" / "toy.yaml"), Options(), catalogue=toy_catalogue(), dump_dir=str(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "01-load.json" and names[-1] == "10-emit.json"
    assert [n.split("-", 1)[1][:-5] for n in names[2:-1]] == [name for name, _ in PASSES]
    lowered = json.loads((tmp_path / "05-lower.json").read_text())
    assert "draw" in lowered["programs"] and lowered["nodes"]["lm"]["kind"] == "toy_lm"
