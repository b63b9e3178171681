"""Pass 3, resolve (part 0): `include:`, other graph files compiled into this one, each under a name.

    include:
      llm: smollm2.yaml                          # its default preset and placement
      tts: {graph: orpheus.yaml, preset: tiny}

Each included file is loaded, validated and resolved on its own (its preset, params, nodes, walks,
streams, tasks and placement profile, and its own includes), then merged into this graph with every
name it declares prefixed by `<name>.`: its node `lm` is `llm.lm` here, its walk `prefill`
`llm.prefill`, its task `chat` `llm.chat`, its param `max_tokens` `llm.max_tokens`. This graph's own
walks, streams and tasks may then name them. Its YAML paths are prefixed with (INCLUDED, name) and
this file's `Doc` learns where they lie, so an error a later pass finds in an included part still
names the included file's line and column.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Callable

import msgspec

from mstar_compiler import plan
from mstar_compiler.errors import Path, did_you_mean
from mstar_compiler.ir import (IR, ForEachIR, IfIR, IncludeIR, LoopStep, NodeStep, Options, ParStep, SeqStep,
                               Step, TaskStepIR, WalkRunIR)
from mstar_compiler.passes import load, validate
from mstar_compiler.passes.load import INCLUDED


def run(ir: IR, preset: dict[str, Any], resolve: Callable[[IR], IR]) -> None:
    """Resolve (with `resolve`, pass resolve's own entry) and merge every `include:` of the graph,
    before its own params, nodes and walks."""
    chosen = preset.get("include", {})
    entries = ir.doc.data.get("include", {})
    for name in chosen:
        if name not in entries:
            raise ir.doc.error(f"preset '{ir.preset}' chooses a preset for unknown include '{name}'",
                               ("presets", ir.preset, "include", name), did_you_mean(name, entries), key=True)
    for section in ("params", "nodes", "walks", "streams", "tasks"):
        for name in ir.doc.data.get(section, {}):
            if name in entries:
                raise ir.doc.error(f"'{name}' names both an include and one of the graph's {section}",
                                   (section, name), f"its {section} are named `{name}.<theirs>` here: rename one",
                                   key=True)
    for name, raw in entries.items():
        entry = {"graph": raw} if isinstance(raw, str) else raw
        preset_path: Path = ("presets", ir.preset, "include", name) if name in chosen else ("include", name, "preset")
        sub = _load_include(ir, name, entry, chosen.get(name, entry.get("preset")), preset_path)
        _merge(ir, name, resolve(sub))
    served = {ir.doc.data["model"]: "this graph"}
    for key, inc in ir.includes.items():     # a server routes each request by its model's name
        if inc.model.model in served:
            raise ir.doc.error(f"include '{key}' serves the model '{inc.model.model}', as {served[inc.model.model]} "
                               "does: a server tells its models apart by name", inc.path,
                               "include a graph once, or give one of them another `model:`")
        served[inc.model.model] = f"include '{key}'"


def _load_include(ir: IR, name: str, entry: dict[str, Any], preset: str | None, preset_path: Path) -> IR:
    """The IR of include `name`, loaded and validated, to be resolved like any graph."""
    path: Path = ("include", name)
    file = os.path.normpath(os.path.join(os.path.dirname(ir.doc.file), entry["graph"]))
    real = os.path.realpath(file)
    chain = ir.include_chain or (os.path.realpath(ir.doc.file),)
    if real in chain:
        names = " -> ".join(os.path.basename(f) for f in (*chain, real))
        raise ir.doc.error(f"include cycle: {names}", (*path, "graph") if isinstance(ir.doc.get(path), dict) else path,
                           "a graph cannot include itself, directly or through another")
    if not os.path.isfile(file):
        raise ir.doc.error(f"include '{name}': no graph file {file}", path,
                           "the path is relative to the including file")
    doc = load.load_file(file)
    validate.run(doc)
    presets = doc.data.get("presets", {})
    if preset is not None and preset not in presets:
        raise ir.doc.error(f"{entry['graph']} has no graph preset '{preset}'", preset_path,
                           did_you_mean(preset, presets) or "it declares no presets")
    quant = {k[len(name) + 1:]: v for k, v in ir.options.quant.items() if k.startswith(name + ".")}
    options = Options(preset=preset, placement=entry.get("placement"), quant=quant)
    if entry.get("placement") is not None and entry["placement"] not in doc.data.get("placements", {"single": 0}):
        raise ir.doc.error(f"{entry['graph']} has no placement profile '{entry['placement']}'",
                           (*path, "placement"), did_you_mean(entry["placement"], doc.data.get("placements", {})))
    return IR(doc=doc, catalogue=ir.catalogue, options=options, include_chain=(*chain, real))


def _merge(ir: IR, name: str, sub: IR) -> None:
    prefix = name + "."
    names = _Names(prefix)
    ir.included_texts += [*sub.included_texts, sub.doc.text]
    for p, pos in sub.doc.value_pos.items():
        if p:
            ir.doc.value_pos[(INCLUDED, name, *p)] = pos
    for p, pos in sub.doc.key_pos.items():
        ir.doc.key_pos[(INCLUDED, name, *p)] = pos
    ir.doc.value_pos[(INCLUDED, name)] = ir.doc.where(("include", name))
    for param in sub.params.values():
        param.spec = msgspec.structs.replace(param.spec, name=prefix + param.spec.name)
        param.path = names.path(param.path)
        ir.params[param.spec.name] = param
    for node in sub.nodes.values():
        node.name, node.weight_key = prefix + node.name, prefix + node.weight_key
        node.param_args = {arg: prefix + p for arg, p in node.param_args.items()}
        node.path, node.quant_path = names.path(node.path), names.path(node.quant_path)
        ir.nodes[node.name] = node
    for walk, seq in sub.walks.items():
        ir.walks[prefix + walk] = names.seq(seq)
    for edge in sub.edge_decls:
        edge.src_node, edge.dst_node, edge.path = prefix + edge.src_node, prefix + edge.dst_node, names.path(edge.path)
        ir.edge_decls.append(edge)
    for stream in sub.streams.values():
        stream.name, stream.dst_node = prefix + stream.name, prefix + stream.dst_node
        stream.src_node = names.node(stream.src_node)
        stream.path, stream.policy_path = names.path(stream.path), names.path(stream.policy_path)
        ir.streams[stream.name] = stream
    for ts in sub.task_streams.values():
        ts.spec = msgspec.structs.replace(ts.spec, name=prefix + ts.spec.name, task=prefix + ts.spec.task)
        ts.path, ts.policy_path = names.path(ts.path), names.path(ts.policy_path)
        ir.task_streams[ts.spec.name] = ts
    for task in sub.tasks.values():
        task.name, task.path = prefix + task.name, names.path(task.path)
        for track in task.tracks:
            track.path = names.path(track.path)
            track.per_chunk = track.per_chunk and prefix + track.per_chunk
            track.steps = [names.task_step(s) for s in track.steps]
        ir.tasks[task.name] = task
    for cascade in sub.cascades.values():
        spec = cascade.spec
        cascade.spec = msgspec.structs.replace(spec, name=prefix + spec.name, stages=[
            msgspec.structs.replace(s, task=prefix + s.task) for s in spec.stages])
        cascade.path, cascade.stage_paths = names.path(cascade.path), [names.path(p) for p in cascade.stage_paths]
        ir.cascades[cascade.spec.name] = cascade
    for key, inner in sub.includes.items():          # its own includes, one level down
        inner.model = msgspec.structs.replace(inner.model, name=prefix + key,
                                              default_task=prefix + inner.model.default_task)
        inner.profile = names.profile(inner.profile)
        inner.profile_path, inner.path = names.path(inner.profile_path), names.path(inner.path)
        ir.includes[prefix + key] = inner
    profiles = sub.doc.data.get("placements", {})
    profile_path = ("placements", sub.placement_name) if profiles else ()
    ir.includes[name] = IncludeIR(
        model=plan.IncludedModel(name=name, model=sub.model, source=os.path.basename(sub.doc.file),
                                 preset=sub.preset, placement=sub.placement_name,
                                 default_task=prefix + sub.default_task),
        profile=names.profile(profiles[sub.placement_name] if profiles else {"*": 0}),
        profile_path=names.path(profile_path), device_memory=sub.device_memory, path=("include", name))


class _Names:
    """Renames what an included graph declares: `<prefix>` before each name, (INCLUDED, name) before each path."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.head: Path = (INCLUDED, prefix[:-1])

    def path(self, path: Path) -> Path:
        return (*self.head, *path) if path else path

    def node(self, node: str) -> str:
        return node if node == plan.CLIENT else self.prefix + node

    def seq(self, seq: SeqStep) -> SeqStep:
        return SeqStep([self.step(s) for s in seq.steps], self.path(seq.path))

    def step(self, step: Step) -> Step:
        if isinstance(step, NodeStep):
            return NodeStep(self.prefix + step.node, self.path(step.path))
        if isinstance(step, ParStep):
            return ParStep([[self.step(s) for s in branch] for branch in step.branches], self.path(step.path))
        if isinstance(step, SeqStep):
            return self.seq(step)
        loop = copy.copy(step)
        assert isinstance(loop, LoopStep)
        loop.count = self._count(step.count)
        loop.until = [msgspec.structs.replace(c, param=c.param and self.prefix + c.param) for c in step.until]
        loop.body = self.seq(step.body)
        loop.carries = [copy.copy(c) for c in step.carries]
        for c in loop.carries:
            c.carry = msgspec.structs.replace(c.carry, src_node=self.prefix + c.carry.src_node,
                                              dst_node=self.prefix + c.carry.dst_node)
            c.path = self.path(c.path)
        loop.emits = [copy.copy(e) for e in step.emits]
        for e in loop.emits:
            e.output, e.path = msgspec.structs.replace(e.output, node=self.prefix + e.output.node), self.path(e.path)
        loop.watch = step.watch and (self.prefix + step.watch[0], step.watch[1])
        loop.path = self.path(step.path)
        return loop

    def _count(self, count: plan.Count) -> plan.Count:
        return count if count.param is None else msgspec.structs.replace(count, param=self.prefix + count.param)

    def task_step(self, step: TaskStepIR) -> TaskStepIR:
        if isinstance(step, WalkRunIR):
            return WalkRunIR(self.prefix + step.walk, self.path(step.path))
        if isinstance(step, ForEachIR):
            return ForEachIR({m: [self.prefix + w for w in walks] for m, walks in step.walks.items()},
                             self.path(step.path))
        assert isinstance(step, IfIR)
        cond = step.cond
        if cond.kind == "param":
            cond = msgspec.structs.replace(cond, param=self.prefix + cond.param)
        return IfIR(cond, [self.task_step(s) for s in step.then], [self.task_step(s) for s in step.otherwise],
                    self.path(step.path))

    def profile(self, profile: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, spec in profile.items():
            if isinstance(spec, dict) and "walks" in spec:
                spec = {**spec, "walks": {self.prefix + w: r for w, r in spec["walks"].items()}}
            out[self.prefix + key] = spec
        return out
