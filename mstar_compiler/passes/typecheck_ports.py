"""Typecheck helpers: a node's ports with shapes resolved from its dims, lookups with
did-you-mean, and the compatibility rule of an edge.
"""
from __future__ import annotations

from mstar_compiler import plan
from mstar_compiler.catalogue import Port as SpecPort
from mstar_compiler.errors import Path, did_you_mean
from mstar_compiler.ir import IR, NodeIR


def resolve_ports(ir: IR, node: NodeIR) -> None:
    """Fill `node.inputs` / `node.outputs` from its kind with axes resolved from dims."""
    node.inputs = [_resolve(ir, node, p) for p in node.spec.inputs]
    node.outputs = [_resolve(ir, node, p) for p in node.spec.outputs]


def _resolve(ir: IR, node: NodeIR, p: SpecPort) -> plan.Port:
    shape: list[str | int] = []
    for axis in p.shape:
        value = node.dims.get(axis) if isinstance(axis, str) else axis
        # A dims key resolves to its int; any other name stays a dynamic symbol.
        shape.append(value if isinstance(value, int) and not isinstance(value, bool) else axis)
    return plan.Port(name=p.name, dtype=p.dtype, shape=shape, stream=p.stream, optional=p.optional)


def port(ir: IR, node: str, name: str, *, output: bool, path: Path, key: bool = False) -> plan.Port:
    """The port `node.name` (an output or an input), or a CompileError with did-you-mean."""
    ports = ir.nodes[node].outputs if output else ir.nodes[node].inputs
    found = next((p for p in ports if p.name == name), None)
    if found is None:
        side = "output" if output else "input"
        raise ir.doc.error(f"node '{node}' ({ir.nodes[node].kind}) has no {side} port '{name}'", path,
                           did_you_mean(name, [p.name for p in ports]) or f"it has no {side} ports", key=key)
    return found


def describe(p: plan.Port) -> str:
    """`name: dtype[axes]` for messages."""
    return f"{p.name}: {p.dtype}[{', '.join(str(a) for a in p.shape)}]"


def check_compatible(ir: IR, src: plan.Port, dst: plan.Port, src_name: str, dst_name: str, path: Path) -> None:
    """Same dtype, same rank, equal resolved axes (dynamic symbols match anything)."""
    if src.dtype != dst.dtype:
        raise ir.doc.error(f"type mismatch: {src_name} is {src.dtype}, {dst_name} expects {dst.dtype}", path,
                           "connect ports of the same dtype")
    models = [_model(ir, name.rpartition(".")[0]) for name in (src_name, dst_name)]
    if src.dtype == "tokens" and all(models) and models[0] != models[1]:    # two included models' vocabularies
        raise ir.doc.error(f"{src_name} writes token ids of {models[0]}'s vocabulary, which mean nothing to "
                           f"{dst_name} of {models[1]}", path,
                           "text crosses between models as text: join their tasks in a cascade "
                           "(tasks: {name: {cascade: [...]}})")
    if len(src.shape) != len(dst.shape) or any(
            isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(src.shape, dst.shape)):
        raise ir.doc.error(f"shape mismatch: {src_name} is {src.dtype}[{_axes(src)}], "
                           f"{dst_name} expects {dst.dtype}[{_axes(dst)}]", path,
                           "the nodes' presets disagree on a dimension; pick matching presets")


def _model(ir: IR, node: str) -> str:
    """The include declaring `node` ("" for the graph's own nodes)."""
    return max((name for name in ir.includes if node.startswith(name + ".")), key=len, default="")


def _axes(p: plan.Port) -> str:
    return ", ".join(str(a) for a in p.shape)
