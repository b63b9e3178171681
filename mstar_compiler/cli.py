"""`mstarc`: compile, lint, explain and draw walk graphs. Torch-free.

    mstarc compile GRAPH -o plan.bin [--placement NAME] [--preset NAME]
                   [--device-memory 80GiB] [--devices N] [--quant NODE=SCHEME ...] [--dump-stages DIR]
    mstarc lint PATH... [--format text|github]
    mstarc explain plan.bin
    mstarc graph GRAPH [--format dot|svg|json] [-o FILE] [--placement NAME] [--preset NAME]

Exit status: 0 ok, 1 a graph has errors (CompileError) or a plan is unreadable, 2 usage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from mstar_compiler.errors import CompileError
from mstar_compiler.ir import Options
from mstar_compiler.plan import PlanFormatError, load_plan
from mstar_compiler.quant import SCHEMES
from mstar_compiler.units import parse_size


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mstarc", description="the mstar walk-graph compiler")
    sub = parser.add_subparsers(dest="command", required=True)
    comp = sub.add_parser("compile", help="compile a graph to plan.bin")
    comp.add_argument("graph")
    comp.add_argument("-o", "--output", required=True)
    comp.add_argument("--dump-stages", metavar="DIR")
    _add_options(comp)
    lint = sub.add_parser("lint", help="check graph files (CI)")
    lint.add_argument("paths", nargs="+")
    lint.add_argument("--format", choices=("text", "github"), default="text")
    exp = sub.add_parser("explain", help="print a plan for people")
    exp.add_argument("plan")
    graph = sub.add_parser("graph", help="draw a graph (DOT, SVG via Graphviz, or the page's layout as JSON)")
    graph.add_argument("graph")
    graph.add_argument("--format", choices=("dot", "svg", "json"), default="dot")
    graph.add_argument("-o", "--output")
    _add_options(graph)
    return parser


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--placement")
    parser.add_argument("--preset")
    parser.add_argument("--device-memory", metavar="SIZE", help="per device, e.g. 80GiB")
    parser.add_argument("--devices", type=int, metavar="N")
    parser.add_argument("--quant", action="append", default=[], metavar="NODE=SCHEME",
                        help="quantize a node's linears (int8, int4_g32; none: as loaded), over the graph's own `quant:`")


def _options(args: argparse.Namespace) -> Options:
    memory = None
    if args.device_memory is not None:
        try:
            memory = parse_size(args.device_memory)
        except ValueError as exc:
            raise CompileError(f"--device-memory: {exc}") from None
    if args.devices is not None and args.devices < 1:
        raise CompileError("--devices must be at least 1")
    quant = {}
    for item in args.quant:
        node, _, scheme = item.partition("=")
        if not node or scheme not in (*SCHEMES, "none"):
            raise CompileError(f"--quant {item}: give NODE=SCHEME, SCHEME one of {', '.join(SCHEMES)}, none")
        quant[node] = scheme
    return Options(preset=args.preset, placement=args.placement, device_memory=memory, devices=args.devices,
                   quant=quant)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"compile": _compile, "lint": _lint, "explain": _explain, "graph": _graph}[args.command](args)
    except CompileError as exc:
        print(exc, file=sys.stderr)
        return 1
    except PlanFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _compile(args: argparse.Namespace) -> int:
    from mstar_compiler.pipeline import compile_file
    compiled = compile_file(args.graph, _options(args), dump_dir=args.dump_stages)
    try:
        Path(args.output).write_bytes(compiled.data)
    except OSError as exc:
        raise CompileError(f"cannot write {args.output}: {exc.strerror}") from None
    print(f"{args.output}: {len(compiled.data)} bytes, {len(compiled.plan.ranks)} rank(s), "
          f"{len(compiled.plan.nodes)} nodes, {len(compiled.plan.walks)} walks")
    return 0


def _graph_files(paths: Sequence[str]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(str(p) for p in Path(path).rglob("*.yaml"))
            files += sorted(str(p) for p in Path(path).rglob("*.yml"))
        else:
            files.append(path)
    return files


def _lint(args: argparse.Namespace) -> int:
    from mstar_compiler.pipeline import compile_file
    files = _graph_files(args.paths)
    failures = 0
    for file in files:
        try:
            compile_file(file)
        except CompileError as exc:
            failures += 1
            print(_github(exc) if args.format == "github" else str(exc))
    print(f"{len(files) - failures}/{len(files)} graph file(s) ok", file=sys.stderr)
    return 1 if failures or not files else 0


def _github(exc: CompileError) -> str:
    """A GitHub Actions workflow annotation (`::error file=...,line=...,col=...::msg`)."""
    message = exc.message + (f" ({exc.hint})" if exc.hint else "")
    message = message.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if exc.position is None:
        return f"::error title=mstarc::{message}"
    pos = exc.position
    return f"::error file={pos.file},line={pos.line},col={pos.column},title=mstarc::{message}"


def _explain(args: argparse.Namespace) -> int:
    from mstar_compiler.explain import explain
    print(explain(load_plan(args.plan)), end="")
    return 0


def _graph(args: argparse.Namespace) -> int:
    from mstar_compiler.graph_dot import GraphvizMissing, to_dot, to_svg
    from mstar_compiler.graph_layout import layout
    from mstar_compiler.pipeline import compile_file
    compiled = compile_file(args.graph, _options(args)).plan
    try:
        if args.format == "json":
            text = json.dumps(layout(compiled), indent=1) + "\n"
        else:
            text = to_svg(to_dot(compiled)) if args.format == "svg" else to_dot(compiled)
    except GraphvizMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
