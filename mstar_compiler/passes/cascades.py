"""Cascades: tasks of tasks, the server running each stage as a request of its task, text between them.

    tasks:
      converse:
        cascade:
          - {transcribe: asr.chat}                     # the request's audio -> its transcript
          - {chat: llm.chat}                           # the transcript as the user's turn -> the answer
          - {speak: tts.speech, clauses: {delimiters: [".", "!", "?", ","], min: 12, max: 160}}

Between stages text moves as text: what a stage's model writes is detokenised by that model's
tokenizer and becomes the next stage's input, tokenised by the next model's own prompt (a chat
template, a voice prompt). That is the conversion between vocabularies, so no token id crosses from
one model to another. A speaking stage takes the text before it in clauses (`clauses:`, a delimited
policy: one request per clause, the first spoken while the rest is written); without `clauses:` it
speaks the text whole. Resolved with the tasks (pass resolve), checked once the tasks' request
inputs are known (pass typecheck); the plan lists them under `cascades`.
"""
from __future__ import annotations

from typing import Any

from mstar_compiler import plan
from mstar_compiler.errors import Path, did_you_mean
from mstar_compiler.ir import IR, CascadeIR, task_walks
from mstar_compiler.passes.typecheck_loops import walk_nodes

ROLES = ("transcribe", "chat", "speak")
_READS = {"transcribe": "audio", "chat": "tokens", "speak": "tokens"}     # what its task reads from a request
_WRITES = {"transcribe": "tokens", "chat": "tokens", "speak": "audio"}    # ... and what it answers


def is_cascade(raw: Any) -> bool:
    return isinstance(raw, dict) and "cascade" in raw


def resolve(ir: IR, name: str, raw: dict[str, Any]) -> CascadeIR:
    """The cascade task `name`: its stages' roles, tasks and clause policies, in an order that can run."""
    path: Path = ("tasks", name)
    stages, paths = [], []
    for i, stage in enumerate(raw["cascade"]):
        spath: Path = (*path, "cascade", i)
        roles = [r for r in ROLES if r in stage]
        if len(roles) != 1:
            raise ir.doc.error(f"a cascade stage names one task as one of {', '.join(ROLES)}"
                               f"{'; this one names ' + ' and '.join(roles) if roles else ''}", spath,
                               "e.g. {chat: llm.chat}")
        role = roles[0]
        task = stage[role]
        if task not in ir.tasks:
            hint = "a stage runs a task, not another cascade" if task in ir.cascades or task == name else \
                did_you_mean(task, ir.tasks)
            raise ir.doc.error(f"unknown task '{task}'", (*spath, role), hint)
        stages.append(plan.CascadeStage(role, task, _clauses(ir, role, stage, spath)))
        paths.append(spath)
    chats = [i for i, stage in enumerate(stages) if stage.role == "chat"]
    if len(chats) != 1:
        raise ir.doc.error(f"a cascade has one `chat` stage (the model that answers), this one has {len(chats)}",
                           paths[chats[1]] if chats else (*path, "cascade"),
                           "e.g. [{transcribe: asr.chat}, {chat: llm.chat}, {speak: tts.speech}]")
    for i, stage in enumerate(stages):
        if stage.role == "transcribe" and i:
            raise ir.doc.error("`transcribe` is a cascade's first stage: it reads the request's audio", paths[i],
                               "move it first")
        if stage.role == "speak" and i != len(stages) - 1:
            raise ir.doc.error("`speak` is a cascade's last stage: no stage reads audio", paths[i], "move it last")
    return CascadeIR(plan.Cascade(name, stages), path, paths)


def _clauses(ir: IR, role: str, stage: dict[str, Any], path: Path) -> plan.ChunkPolicy | None:
    if "clauses" not in stage:
        return None
    cpath = (*path, "clauses")
    if role != "speak":
        raise ir.doc.error(f"a {role} stage reads its text whole: only a speak stage takes it in clauses", cpath,
                           key=True)
    value = stage["clauses"]
    if value["min"] > value["max"]:
        raise ir.doc.error(f"clauses min {value['min']} exceeds max {value['max']}: no clause could end at a "
                           "delimiter", (*cpath, "min"), "min <= max (e.g. min: 12, max: 160)")
    return plan.ChunkPolicy(kind="delimited", size=value["max"], delimiters=list(value["delimiters"]),
                            min_size=value["min"])


def check(ir: IR) -> None:
    """Each stage's task reads and answers what its role needs (pass typecheck: request inputs known)."""
    for cascade in ir.cascades.values():
        for stage, path in zip(cascade.spec.stages, cascade.stage_paths):
            walks = {w for track in ir.tasks[stage.task].tracks for w in task_walks(track.steps)}
            reads = {i.dtype for i in ir.request_inputs if i.walk in walks}
            if _READS[stage.role] not in reads:
                raise ir.doc.error(f"task '{stage.task}' reads no {_READS[stage.role]} from its request, so it cannot "
                                   f"{stage.role} in cascade '{cascade.spec.name}'", (*path, stage.role),
                                   f"its walks read {', '.join(sorted(reads)) or 'no request input'}")
            writes = {p.dtype for w in walks for out in ir.walk_outputs.get(w, [])
                      for p in ir.nodes[out.node].outputs if p.name == out.port}
            writes |= {p.dtype for w in walks for n in walk_nodes(ir.walks[w]) for p in ir.nodes[n].outputs
                       if p.dtype == "audio"}     # a speaking task's audio streams out of a per-chunk track
            if _WRITES[stage.role] not in writes:
                raise ir.doc.error(f"task '{stage.task}' answers no {_WRITES[stage.role]}, so it cannot "
                                   f"{stage.role} in cascade '{cascade.spec.name}'", (*path, stage.role))

