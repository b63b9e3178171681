"""The compiler: a flat list of named passes, each IR -> IR.

    load -> validate -> resolve -> typecheck -> lower -> place -> memory -> capture -> buffers -> emit

`compile_file` / `compile_text` run them; `dump_dir` writes every intermediate as
`NN-<pass>.json`; `verify=True` runs `mstar_compiler.verify` after each pass (tests do).
Any exception other than CompileError escaping a pass is a compiler bug.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import msgspec

from mstar_compiler import plan, verify as verifier
from mstar_compiler.catalogue import Catalogue, load_catalogue
from mstar_compiler.ir import IR, Options
from mstar_compiler.passes import (buffers, capture, emit, load, lower, memory, place, resolve, typecheck,
                                   validate)

PASSES: list[tuple[str, Callable[[IR], IR]]] = [
    ("resolve", resolve.run),
    ("typecheck", typecheck.run),
    ("lower", lower.run),
    ("place", place.run),
    ("memory", memory.run),
    ("capture", capture.run),
    ("buffers", buffers.run),
]


@dataclass(frozen=True)
class Compiled:
    plan: plan.Plan
    data: bytes          # plan.bin bytes


def compile_text(text: str, file: str, options: Options | None = None, *, catalogue: Catalogue | None = None,
                 verify: bool = False, dump_dir: str | None = None) -> Compiled:
    """Compile graph YAML `text` (named `file` in messages); raises CompileError."""
    doc = load.load_text(text, file)
    _dump(dump_dir, 1, "load", doc.data)
    validate.run(doc)
    _dump(dump_dir, 2, "validate", doc.data)
    ir = IR(doc=doc, catalogue=catalogue or load_catalogue(), options=options or Options())
    for i, (name, run) in enumerate(PASSES, start=3):
        ir = run(ir)
        if verify:
            verifier.check(ir, name)
        _dump(dump_dir, i, name, ir_to_builtins(ir))
    built, data = emit.run(ir)
    if verify:
        verifier.check_plan(built, data)
    _dump(dump_dir, len(PASSES) + 3, "emit", msgspec.to_builtins(built))
    return Compiled(built, data)


def compile_file(path: str, options: Options | None = None, **kwargs: Any) -> Compiled:
    """Compile the graph file at `path`."""
    doc = load.load_file(path)
    return compile_text(doc.text, path, options, **kwargs)


def ir_to_builtins(ir: IR) -> dict[str, Any]:
    """The IR as JSON-able data (for --dump-stages and tests)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ir):
        if f.name in ("doc", "catalogue"):
            continue
        value = getattr(ir, f.name)
        if f.name == "nodes":
            value = {name: {g.name: getattr(n, g.name) for g in dataclasses.fields(n) if g.name != "spec"}
                     for name, n in value.items()}
        out[f.name] = msgspec.to_builtins(value, enc_hook=repr)
    return out


def _dump(dump_dir: str | None, index: int, name: str, data: Any) -> None:
    if dump_dir is None:
        return
    os.makedirs(dump_dir, exist_ok=True)
    with open(os.path.join(dump_dir, f"{index:02d}-{name}.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=False, default=str)
        f.write("\n")
