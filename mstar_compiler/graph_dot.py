"""`mstarc graph`: a compiled plan drawn as Graphviz DOT (SVG through the `dot` program).

The picture comes from `graph_layout.layout`, the same data the server's page draws.
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Any

from mstar_compiler import plan
from mstar_compiler.graph_layout import layout


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(p: plan.Plan) -> str:
    """Nodes grouped by rank; edges labelled with their ports; streams dashed (with their
    chunk policy); carries dotted."""
    g: dict[str, Any] = layout(p)
    lines = [f"digraph {_q(g['model'])} {{", "  rankdir=LR;", "  node [shape=box, fontname=Helvetica];"]
    kinds = {n["name"]: n["kind"] for n in g["nodes"]}
    for band in g["ranks"]:
        lines.append(f"  subgraph cluster_rank{band['index']} {{ label={_q('rank ' + str(band['index']))};")
        for name in band["nodes"]:
            label = _q(name)[:-1] + "\\n" + kinds[name] + '"'  # Graphviz line break
            lines.append(f"    {_q(name)} [label={label}];")
        lines.append("  }")
    for e in g["edges"]:
        lines.append(f"  {_q(e['src'])} -> {_q(e['dst'])} [label={_q(e['src_port'] + '->' + e['dst_port'])}];")
    for c in g["carries"]:
        lines.append(f"  {_q(c['src'])} -> {_q(c['dst'])} [style=dotted, label={_q('carry ' + c['dst_port'])}];")
    for s in g["streams"]:
        lines.append(f"  {_q(s['src'])} -> {_q(s['dst'])} [style=dashed, color=blue, "
                     f"label={_q('stream ' + s['name'] + ' (' + s['policy'] + ')')}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


class GraphvizMissing(RuntimeError):
    """The `dot` program is not installed."""


def to_svg(dot: str) -> str:
    """SVG from DOT via Graphviz; GraphvizMissing when `dot` is not on PATH."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing("SVG needs Graphviz's `dot` program, which is not installed "
                              "(Debian/Ubuntu: apt-get install graphviz); `--format dot` works without it "
                              "(and `--format json`, the layout the server's page draws)")
    done = subprocess.run([exe, "-Tsvg"], input=dot, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise GraphvizMissing(f"dot failed: {done.stderr.strip()}")
    return done.stdout
