"""graph_layout: the one layout `mstarc graph` and the server's page draw; torch-free."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from compiler_helpers import REPO
from mstar_compiler.cli import main
from mstar_compiler.graph_dot import to_dot
from mstar_compiler.graph_layout import layout
from mstar_compiler.ir import Options
from mstar_compiler.pipeline import compile_file


def _plan(graph: str, **options):
    return compile_file(str(REPO / "graphs" / f"{graph}.yaml"), Options(**options)).plan


@pytest.mark.parametrize("graph,placement", [("bagel", "cfg_parallel"), ("orpheus", "disaggregated"),
                                             ("qwen3_omni", "thinker_talker"), ("smollm2", "replicas"),
                                             ("vjepa2_ac", None)])
def test_every_node_once_inside_its_lead_ranks_band_without_overlap(graph, placement) -> None:
    p = _plan(graph, placement=placement)
    g = layout(p)
    assert [n["name"] for n in g["nodes"]] == [n.name for r in p.ranks for n in p.nodes
                                               if n.placement.ranks[0] == r.index]
    assert sorted(n["name"] for n in g["nodes"]) == sorted(n.name for n in p.nodes)
    bands = {b["index"]: b for b in g["ranks"]}
    for n in g["nodes"]:
        b = bands[n["rank"]]
        assert b["x"] <= n["x"] and n["x"] + n["w"] <= b["x"] + b["w"] <= g["width"]
        assert b["y"] <= n["y"] and n["y"] + n["h"] <= b["y"] + b["h"] <= g["height"]
    boxes = [(n["x"], n["y"]) for n in g["nodes"]]
    assert len(set(boxes)) == len(boxes)


def test_edges_deduplicated_with_their_walks_and_streams_with_their_policy() -> None:
    p = _plan("bagel")
    g = layout(p)
    pairs = [(e["src"], e["src_port"], e["dst"], e["dst_port"]) for e in g["edges"]]
    assert len(pairs) == len(set(pairs)) == len({(e.src_node, e.src_port, e.dst_node, e.dst_port) for e in p.edges})
    for e in g["edges"]:
        assert e["walks"] == [x.walk for x in p.edges if (x.src_node, x.src_port, x.dst_node, x.dst_port)
                              == (e["src"], e["src_port"], e["dst"], e["dst_port"])]
    orpheus = layout(_plan("orpheus", preset="tiny"))
    assert [(s["name"], s["src"], s["dst"], s["policy"]) for s in orpheus["streams"]] == \
        [("audio_tokens", "lm", "snac", "sliding 28/7")]
    assert orpheus["tasks"] == [{"name": "speech", "tracks": [
        {"name": "lm", "walks": ["read", "talk"], "per_chunk": None},
        {"name": "vocoder", "walks": ["vocode"], "per_chunk": "audio_tokens"}]}]


def test_producers_sit_left_of_their_consumers() -> None:
    g = layout(_plan("bagel"))
    x = {n["name"]: n["x"] for n in g["nodes"]}
    assert x["vit"] < x["llm"] < x["cfg"] < x["vae_dec"]


def test_dot_and_json_come_from_the_same_layout(capsys) -> None:
    p = _plan("orpheus", preset="tiny")
    dot = to_dot(p)
    g = layout(p)
    assert all(f'"{n["name"]}" [label=' in dot for n in g["nodes"])
    assert 'label="stream audio_tokens (sliding 28/7)"' in dot
    assert main(["graph", str(REPO / "graphs" / "orpheus.yaml"), "--preset", "tiny", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == g


def test_layout_does_not_import_torch() -> None:
    code = ("import sys\nfrom mstar_compiler.cli import main\n"
            f"assert main(['graph', {str(REPO / 'graphs' / 'bagel.yaml')!r}, '--format', 'json', '-o', '/dev/null']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
