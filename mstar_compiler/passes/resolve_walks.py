"""Pass 3, resolve (part 2): walks (sub-walks inlined), loop counts and exit conditions,
declared edges and streams; then tasks via `resolve_tasks`.
"""
from __future__ import annotations

import copy
import re
from typing import Any

from mstar_compiler import plan
from mstar_compiler.errors import Path, did_you_mean
from mstar_compiler.ir import (IR, CarryIR, EdgeDecl, EmitIR, LoopStep, NodeStep, ParStep,
                               SeqStep, Step, StreamIR)
from mstar_compiler.passes import resolve_tasks, task_streams

_COUNT = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_.]*)\s*(?:([-+])\s*([0-9]+))?$")
_EDGE = re.compile(r"^\s*([\w.]+)\.(\w+)\s*->\s*([\w.]+)\.(\w+)\s*$")     # a node may be an include's: a.b


def param_ref(ir: IR, ref: str, path: Path, *, integer: bool = False) -> str:
    """The param name of a `$name` reference, checked to exist (and be an integer)."""
    name = ref[1:].strip()
    if name not in ir.params:
        raise ir.doc.error(f"unknown param '{name}'", path, did_you_mean(name, ir.params))
    if integer and ir.params[name].spec.type != "integer":
        raise ir.doc.error(f"param '{name}' is {ir.params[name].spec.type}; a count needs an integer param",
                           path, f"declare it with `type: integer` at {ir.doc.where(ir.params[name].path)}")
    return name


def run(ir: IR) -> None:
    raw_walks: dict[str, Any] = ir.doc.data.get("walks", {})
    for name in raw_walks:
        if name in ir.nodes:
            raise ir.doc.error(f"'{name}' names both a node and a walk", ("walks", name),
                               "steps refer to either by name: rename one", key=True)
    for name, raw in raw_walks.items():
        ir.walks[name] = _as_seq(_step(ir, raw, ("walks", name), [name]), ("walks", name))
    ir.edge_decls += [_edge(ir, text, ("edges", i)) for i, text in enumerate(ir.doc.data.get("edges", []))]
    for name, raw in ir.doc.data.get("streams", {}).items():
        if task_streams.names_task(ir, raw["to"]):
            ir.task_streams[name] = task_streams.resolve(ir, name, raw, chunk_policy(ir, name, raw))
        else:
            ir.streams[name] = _stream(ir, name, raw)
    resolve_tasks.run(ir)


def _step(ir: IR, raw: Any, path: Path, stack: list[str]) -> Step:
    if isinstance(raw, str):
        return _named(ir, raw, path, stack)
    if isinstance(raw, list):
        return _as_seq([_step(ir, item, (*path, i), stack) for i, item in enumerate(raw)], path)
    if "parallel" in raw:
        return _parallel(ir, raw, path, stack)
    return _loop(ir, raw, path, stack)


def _named(ir: IR, name: str, path: Path, stack: list[str]) -> Step:
    if name in ir.nodes:
        return NodeStep(name, path)
    raw_walks = ir.doc.data.get("walks", {})
    if name not in raw_walks and name in ir.walks:      # an included graph's walk, resolved in its file
        return copy.deepcopy(ir.walks[name])
    if name not in raw_walks:
        raise ir.doc.error(f"unknown node or walk '{name}'", path, did_you_mean(name, [*ir.nodes, *raw_walks]))
    if name in stack:
        raise ir.doc.error(f"walk '{name}' includes itself: {' -> '.join([*stack, name])}", path,
                           "repetition is written with a Loop: {repeat: N, do: ...}")
    return _step(ir, raw_walks[name], ("walks", name), [*stack, name])


def _as_seq(item: Step | list[Step], path: Path) -> SeqStep:
    items = item if isinstance(item, list) else [item]
    steps: list[Step] = []
    for step in items:
        steps.extend(step.steps if isinstance(step, SeqStep) else [step])
    return SeqStep(steps, path)


def _parallel(ir: IR, raw: dict[str, Any], path: Path, stack: list[str]) -> ParStep:
    branches: list[list[NodeStep]] = []
    seen: dict[str, Path] = {}
    for i, item in enumerate(raw["parallel"]):
        bpath = (*path, "parallel", i)
        seq = _as_seq(_step(ir, item, bpath, stack), bpath)
        for step in seq.steps:
            if not isinstance(step, NodeStep):
                raise ir.doc.error("a Parallel branch must be a node or a list of nodes", bpath,
                                   "put loops around the Parallel, not inside a branch")
            if step.node in seen:
                raise ir.doc.error(f"node '{step.node}' runs in two Parallel branches", step.path,
                                   "declare another node with `same_as:` to share its weights")
            seen[step.node] = step.path
        branches.append(seq.steps)
    return ParStep(branches, path)


def _loop(ir: IR, raw: dict[str, Any], path: Path, stack: list[str]) -> LoopStep:
    dynamic = "until" in raw
    if dynamic and "repeat" in raw:
        raise ir.doc.error("a loop has either `repeat:` (Loop) or `until:` + `max:` (DynamicLoop), not both",
                           (*path, "until"), key=True)
    if not dynamic and "repeat" not in raw:
        raise ir.doc.error("loop without bound: add `repeat: N` (Loop) or `until:` + `max: N` (DynamicLoop)",
                           path, "a count may be a param: repeat: $steps")
    if dynamic and "max" not in raw:
        raise ir.doc.error("DynamicLoop without bound: `until:` needs `max:`", path,
                           "e.g. max: $max_tokens")
    if not dynamic and "max" in raw:
        raise ir.doc.error("`max:` belongs to a DynamicLoop (with `until:`); a Loop counts with `repeat:`",
                           (*path, "max"), key=True)
    key = "max" if dynamic else "repeat"
    body = _as_seq(_step(ir, raw["do"], (*path, "do"), stack), (*path, "do"))
    loop = LoopStep(dynamic=dynamic, count=count(ir, raw[key], (*path, key)), until=[], body=body,
                    carries=[], emits=[], watch=None, path=path)
    if dynamic:
        conds = raw["until"] if isinstance(raw["until"], list) else [raw["until"]]
        upath = (*path, "until")
        loop.until = [_exit_cond(ir, c, (*upath, i) if isinstance(raw["until"], list) else upath)
                      for i, c in enumerate(conds)]
    for src, dsts in raw.get("carry", {}).items():
        for dst in dsts if isinstance(dsts, list) else [dsts]:
            loop.carries.append(_carry(ir, src, dst, (*path, "carry", src)))
    loop.emits = [_emit(ir, ref, mode, (*path, "emit", ref)) for ref, mode in raw.get("emit", {}).items()]
    if "watch" in raw:
        loop.watch = port_ref(ir, raw["watch"], (*path, "watch"))
    return loop


def count(ir: IR, raw: Any, path: Path) -> plan.Count:
    """A trip count: an int or `$param [+-] k`."""
    if isinstance(raw, int):
        return plan.Count(const=raw)
    match = _COUNT.match(raw)
    name = param_ref(ir, "$" + match.group(1), path, integer=True)
    offset = int(match.group(3) or 0) * (-1 if match.group(2) == "-" else 1)
    return plan.Count(param=name, offset=offset)


def _exit_cond(ir: IR, raw: Any, path: Path) -> plan.ExitCond:
    if raw == "eos":
        return plan.ExitCond(kind="eos")
    if "stop_token" in raw:
        value = raw["stop_token"]
        if isinstance(value, str):
            return plan.ExitCond(kind="stop_token", param=param_ref(ir, value, (*path, "stop_token"), integer=True))
        return plan.ExitCond(kind="stop_token", tokens=value if isinstance(value, list) else [value])
    value = raw["horizon"]
    if isinstance(value, str):
        return plan.ExitCond(kind="horizon", param=param_ref(ir, value, (*path, "horizon"), integer=True))
    return plan.ExitCond(kind="horizon", value=value)


def port_ref(ir: IR, text: str, path: Path, *, key: bool = False) -> tuple[str, str]:
    """(node, port) of a `node.port` reference whose node exists (ports are checked in typecheck); the
    node may be an included graph's (`asr.thinker.text`)."""
    node, _, port = text.rpartition(".")
    if not port or not node:
        raise ir.doc.error(f"{text!r} is not a `node.port` reference", path, key=key)
    if node not in ir.nodes:
        raise ir.doc.error(f"unknown node '{node}' in '{text}'", path, did_you_mean(node, ir.nodes), key=key)
    return node, port


def _carry(ir: IR, src: str, dst: str, path: Path) -> CarryIR:
    s_node, s_port = port_ref(ir, src, path, key=True)
    d_node, d_port = port_ref(ir, dst, path)
    return CarryIR(plan.Carry(s_node, s_port, d_node, d_port), path)


def _emit(ir: IR, ref: str, mode: str, path: Path) -> EmitIR:
    node, port = port_ref(ir, ref, path, key=True)
    return EmitIR(plan.LoopOutput(node, port, mode), path)


def _edge(ir: IR, text: str, path: Path) -> EdgeDecl:
    s_node, s_port, d_node, d_port = _EDGE.match(text).groups()
    for node in (s_node, d_node):
        if node not in ir.nodes:
            raise ir.doc.error(f"unknown node '{node}' in edge '{text.strip()}'", path, did_you_mean(node, ir.nodes))
    return EdgeDecl(s_node, s_port, d_node, d_port, path)


def _stream(ir: IR, name: str, raw: dict[str, Any]) -> StreamIR:
    path: Path = ("streams", name)
    if raw["from"].partition(".")[0] == plan.CLIENT:      # no node is named so (pass resolve)
        s_node, s_port = raw["from"].split(".", 1)     # client-fed: the request's client pushes the items
    else:
        s_node, s_port = port_ref(ir, raw["from"], (*path, "from"))
    d_node, d_port = port_ref(ir, raw["to"], (*path, "to"))
    policy, ppath = chunk_policy(ir, name, raw)
    if policy.kind == "delimited":
        raise ir.doc.error(f"stream '{name}' ends at node port {d_node}.{d_port}: `delimited` cuts text a client "
                           "writes into a task", ppath, "a node's stream takes fixed, sliding or left_context "
                           "chunks; a text stream is written `to: <task>.text`")
    return StreamIR(name, s_node, s_port, d_node, d_port, policy, path, ppath)


def chunk_policy(ir: IR, name: str, raw: dict[str, Any]) -> tuple[plan.ChunkPolicy, Path]:
    """Stream `name`'s chunk policy (a graph preset's over the stream's own) and where it is written."""
    policies = _preset_policies(ir)
    policy_path: Path = ("presets", ir.preset, "streams", name) if name in policies else ("streams", name, "policy")
    kind, value = next(iter(policies.get(name, raw["policy"]).items()))
    ppath = (*policy_path, kind)
    if kind == "fixed":
        return plan.ChunkPolicy(kind="fixed", size=value), ppath
    if kind == "sliding":
        if value["stride"] > value["window"]:
            raise ir.doc.error(f"sliding stride {value['stride']} exceeds window {value['window']}: items would be skipped",
                               (*ppath, "stride"), "stride <= window (Orpheus: window 28, stride 7)")
        return plan.ChunkPolicy(kind="sliding", size=value["window"], stride=value["stride"]), ppath
    if kind == "delimited":
        if value["min"] > value["max"]:
            raise ir.doc.error(f"delimited min {value['min']} exceeds max {value['max']}: no clause could end at a "
                               "delimiter", (*ppath, "min"), "min <= max (e.g. min: 8, max: 64)")
        return plan.ChunkPolicy(kind="delimited", size=value["max"], delimiters=list(value["delimiters"]),
                                min_size=value["min"]), ppath
    return plan.ChunkPolicy(kind="left_context", size=value["chunk"], context=value["context"]), ppath


def _preset_policies(ir: IR) -> dict[str, Any]:
    """The chosen graph preset's chunk policies by stream (a preset's sizes: an encoder's window)."""
    policies = ir.doc.data.get("presets", {}).get(ir.preset, {}).get("streams", {})
    for name in policies:
        if name not in ir.doc.data.get("streams", {}):
            raise ir.doc.error(f"preset '{ir.preset}' sets the policy of unknown stream '{name}'",
                               ("presets", ir.preset, "streams", name),
                               did_you_mean(name, ir.doc.data.get("streams", {})) or "this graph declares no streams",
                               key=True)
    return policies
