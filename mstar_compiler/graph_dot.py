"""`mstarc graph`: a compiled plan drawn as Graphviz DOT (SVG through the `dot` program)."""
from __future__ import annotations

import shutil
import subprocess

from mstar_compiler import plan


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(p: plan.Plan) -> str:
    """Nodes grouped by rank; edges labelled with their walk; streams dashed; carries dotted."""
    lines = [f"digraph {_q(p.model)} {{", "  rankdir=LR;", "  node [shape=box, fontname=Helvetica];"]
    for r in p.ranks:
        lines.append(f"  subgraph cluster_rank{r.index} {{ label={_q(f'rank {r.index}')};")
        for name in r.nodes:
            if p.node(name).placement.ranks[0] == r.index:
                label = _q(name)[:-1] + "\\n" + p.node(name).kind + '"'  # Graphviz line break
                lines.append(f"    {_q(name)} [label={label}];")
        lines.append("  }")
    seen = set()
    for e in p.edges:
        key = (e.src_node, e.src_port, e.dst_node, e.dst_port)
        if key not in seen:
            seen.add(key)
            lines.append(f"  {_q(e.src_node)} -> {_q(e.dst_node)} [label={_q(f'{e.src_port}->{e.dst_port}')}];")
    for w in p.walks:
        for op in w.program:
            for c in getattr(op, "carries", []):
                lines.append(f"  {_q(c.src_node)} -> {_q(c.dst_node)} [style=dotted, label={_q('carry ' + c.dst_port)}];")
    for s in p.streams:
        lines.append(f"  {_q(s.src_node)} -> {_q(s.dst_node)} [style=dashed, color=blue, "
                     f"label={_q(f'stream {s.name} ({s.policy.kind})')}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


class GraphvizMissing(RuntimeError):
    """The `dot` program is not installed."""


def to_svg(dot: str) -> str:
    """SVG from DOT via Graphviz; GraphvizMissing when `dot` is not on PATH."""
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizMissing("SVG needs Graphviz's `dot` program, which is not installed "
                              "(Debian/Ubuntu: apt-get install graphviz); `--format dot` works without it")
    done = subprocess.run([exe, "-Tsvg"], input=dot, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise GraphvizMissing(f"dot failed: {done.stderr.strip()}")
    return done.stdout
