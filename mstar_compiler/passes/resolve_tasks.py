"""Pass 3, resolve (part 3): tasks (tracks, for_each, conditions), the default task and
the placement profile chosen.
"""
from __future__ import annotations

from typing import Any

from mstar_compiler import plan
from mstar_compiler.errors import Path, did_you_mean
from mstar_compiler.ir import IR, ForEachIR, IfIR, TaskIR, TaskStepIR, TrackIR, WalkRunIR
from mstar_compiler.passes import cascades

# Input modalities a request can carry, and so what `for_each` / `{input: ...}` may name.
MODALITIES = ("text", "image", "audio", "video", "actions")
_OPS = ("eq", "ne", "lt", "le", "gt", "ge")


def run(ir: IR) -> None:
    own = {name: raw for name, raw in ir.doc.data.get("tasks", {}).items() if not cascades.is_cascade(raw)}
    for name, raw in own.items():
        ir.tasks[name] = _task(ir, name, raw)
    for name, raw in ir.doc.data.get("tasks", {}).items():
        if cascades.is_cascade(raw):            # a task of tasks, which the server runs
            ir.cascades[name] = cascades.resolve(ir, name, raw)
    first_included = next((i.model.default_task for i in ir.includes.values() if "." not in i.model.name), "")
    ir.default_task = ir.doc.data.get("default_task", next(iter(own), first_included))
    if ir.default_task in ir.cascades:
        raise ir.doc.error(f"the default task '{ir.default_task}' is a cascade, which the server runs on its "
                           "endpoints", ("default_task",), "name a task of walks")
    if ir.default_task not in ir.tasks:
        raise ir.doc.error(f"unknown task '{ir.default_task}'", ("default_task",), did_you_mean(ir.default_task, ir.tasks))
    _choose_placement(ir)


def _task(ir: IR, name: str, raw: Any) -> TaskIR:
    path: Path = ("tasks", name)
    if isinstance(raw, dict) and "tracks" in raw:
        tracks = [_track(ir, tname, traw, (*path, "tracks", tname)) for tname, traw in raw["tracks"].items()]
    else:
        tracks = [TrackIR("main", _steps(ir, raw, path), None, path)]
    return TaskIR(name, tracks, path)


def _track(ir: IR, name: str, raw: Any, path: Path) -> TrackIR:
    if isinstance(raw, dict) and "per_chunk" in raw:
        stream = raw["per_chunk"]
        if stream not in ir.streams:
            raise ir.doc.error(f"unknown stream '{stream}'", (*path, "per_chunk"), did_you_mean(stream, ir.streams))
        walk = _walk_name(ir, raw["do"], (*path, "do"))
        return TrackIR(name, [WalkRunIR(walk, (*path, "do"))], stream, path)
    return TrackIR(name, _steps(ir, raw, path), None, path)


def _steps(ir: IR, raw: Any, path: Path) -> list[TaskStepIR]:
    if not isinstance(raw, list):
        return [_step(ir, raw, path)]
    return [_step(ir, item, (*path, i)) for i, item in enumerate(raw)]


def _step(ir: IR, raw: Any, path: Path) -> TaskStepIR:
    if isinstance(raw, str):
        return WalkRunIR(_walk_name(ir, raw, path), path)
    if "for_each" in raw:
        walks: dict[str, list[str]] = {}
        for modality, walk in raw.items():
            if modality == "for_each":
                continue
            if modality not in MODALITIES:
                raise ir.doc.error(f"unknown input modality '{modality}'", (*path, modality),
                                   did_you_mean(modality, MODALITIES), key=True)
            names = walk if isinstance(walk, list) else [walk]
            mpath = (*path, modality)
            walks[modality] = [_walk_name(ir, w, (*mpath, i) if isinstance(walk, list) else mpath)
                               for i, w in enumerate(names)]
        return ForEachIR(walks, path)
    then = _steps(ir, raw["then"], (*path, "then"))
    otherwise = _steps(ir, raw["else"], (*path, "else")) if "else" in raw else []
    return IfIR(_cond(ir, raw["if"], (*path, "if")), then, otherwise, path)


def _walk_name(ir: IR, name: str, path: Path) -> str:
    if name in ir.walks:
        return name
    hint = f"'{name}' is a node; tasks run walks" if name in ir.nodes else did_you_mean(name, ir.walks)
    raise ir.doc.error(f"unknown walk '{name}'", path, hint)


def _cond(ir: IR, raw: dict[str, Any], path: Path) -> plan.Cond:
    kinds = [k for k in ("param", "input", "exit", "not") if k in raw]
    ops = [k for k in _OPS if k in raw]
    if len(kinds) != 1:
        raise ir.doc.error("a condition names exactly one of `param:`, `input:`, `exit:`, `not:`", path,
                           "e.g. {param: steps, gt: 10}, {input: image}, {exit: eos}")
    kind = kinds[0]
    if kind == "not":
        inner = _cond(ir, raw["not"], (*path, "not"))
        return plan.Cond(**{**{f: getattr(inner, f) for f in inner.__struct_fields__}, "negate": not inner.negate})
    if (kind == "param") != bool(ops) or len(ops) > 1:
        raise ir.doc.error("a param condition has one comparison: eq, ne, lt, le, gt or ge", path,
                           "e.g. {param: think, eq: true}")
    if kind == "input":
        if raw["input"] not in MODALITIES:
            raise ir.doc.error(f"unknown input modality '{raw['input']}'", (*path, "input"),
                               did_you_mean(raw["input"], MODALITIES))
        return plan.Cond(kind="input", modality=raw["input"])
    if kind == "exit":
        return plan.Cond(kind="exit", reason=raw["exit"])
    name = raw["param"]
    if name not in ir.params:
        raise ir.doc.error(f"unknown param '{name}'", (*path, "param"), did_you_mean(name, ir.params))
    return plan.Cond(kind="param", param=name, op=ops[0], value=raw[ops[0]])


def _choose_placement(ir: IR) -> None:
    profiles = ir.doc.data.get("placements", {})
    name = ir.options.placement
    if name is None:
        name = ir.doc.data.get("default_placement", next(iter(profiles), "single"))
        path: Path = ("default_placement",)
    else:
        path = ("placements",)
    if profiles and name not in profiles or not profiles and name != "single":
        source = "from --placement" if ir.options.placement else "default_placement"
        raise ir.doc.error(f"unknown placement profile '{name}' ({source})", path,
                           did_you_mean(name, profiles) or "declare it under `placements:`",
                           key=path == ("placements",))
    ir.placement_name = name
