"""Pass 10, emit: the IR to a `plan.Plan` and its `plan.bin` bytes (deterministic)."""
from __future__ import annotations

import hashlib
import os
from typing import Any

from mstar_compiler import plan
from mstar_compiler.ir import IR, NodeIR
from mstar_compiler.passes.memory import weight_bytes


def build_plan(ir: IR) -> plan.Plan:
    """The plan the runtime reads, from a fully compiled IR."""
    return plan.Plan(
        format_version=plan.FORMAT_VERSION,
        model=ir.model,
        source=os.path.basename(ir.doc.file),
        source_sha256=_sources_sha256(ir),
        preset=ir.preset,
        placement=ir.placement_name,
        ranks=ir.ranks,
        params=[p.spec for p in ir.params.values()],
        nodes=[_node(ir, n) for n in ir.nodes.values()],
        edges=ir.edges,
        request_inputs=ir.request_inputs,
        walks=[plan.Walk(name, ir.programs[name], ir.walk_outputs[name], _walk_nodes(ir, name))
               for name in ir.walks],
        tasks=ir.task_tables,
        default_task=ir.default_task,
        transfers=ir.transfers,
        streams=ir.plan_streams,
        capture_regions=ir.capture_regions,
        task_streams=[ts.spec for ts in ir.task_streams.values()],
        models=[inc.model for inc in ir.includes.values()],
        cascades=[c.spec for c in ir.cascades.values()],
    )


def _sources_sha256(ir: IR) -> str:
    """The graph file's digest; with includes, of it and every file it includes (an edit to any changes it)."""
    digest = hashlib.sha256(ir.doc.text.encode("utf-8"))
    for text in ir.included_texts:
        digest.update(b"\0" + text.encode("utf-8"))
    return digest.hexdigest()


def _walk_nodes(ir: IR, walk: str) -> list[str]:
    used = set()
    for op in ir.programs[walk]:
        if isinstance(op, plan.Run):
            used.add(op.node)
        elif isinstance(op, plan.Parallel):
            used.update(r.node for b in op.branches for r in b)
    return [n for n in ir.nodes if n in used]


def _node(ir: IR, n: NodeIR) -> plan.Node:
    assert n.placement is not None
    pos = ir.doc.where(n.path, key=True)
    return plan.Node(
        name=n.name, kind=n.kind, preset=n.preset, dims=_plain(n.dims),
        args=_plain(n.args), param_args=n.param_args,
        weight_key=n.weight_key, dtype=n.dtype, num_params=n.spec.num_params(n.dims),
        weight_bytes=weight_bytes(n), placement=n.placement, inputs=n.inputs, outputs=n.outputs,
        has_kv_cache=n.has_kv_cache, kv_pools=n.kv_pools, can_batch=n.spec.can_batch,
        max_batch=n.max_batch, is_capture_safe=n.spec.is_capture_safe,
        source=f"{os.path.basename(pos.file)}:{pos.line}:{pos.column}", weights=n.weights,
        weight_map=n.weight_map, random_weights=n.random_weights,
        executor=n.executor, first_run_chunks=n.spec.first_run_chunks, declared_layers=n.declared_layers,
        published_layers=n.published_layers, quant=n.quant,
    )


def _plain(value: Any) -> Any:
    """Tuples as lists (what msgpack gives back), so a plan equals its decoded self."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def run(ir: IR) -> tuple[plan.Plan, bytes]:
    built = build_plan(ir)
    return built, plan.dump_plan(built)
