"""Streams into a task: text a client writes in pieces, cut into clauses by a `delimited` policy, each
clause the text input of one request of the task, run in order (the server's /v1/audio/speech/stream).

    streams:
      input_text:
        from: client.text
        to: speech.text
        policy: {delimited: {delimiters: [".", "!", "?", ","], min: 8, max: 64}}

Resolved with the other streams (pass resolve: the `to` names a task, not a node) and checked once the
tasks and their request inputs are known (pass typecheck). Such a stream is not a node's streaming
edge: it reaches no rank and has no buffer; the plan lists it under `task_streams`.
"""
from __future__ import annotations

from typing import Any

from mstar_compiler import plan
from mstar_compiler.errors import Path
from mstar_compiler.ir import IR, TaskStreamIR, task_walks

EXAMPLE = "delimited: {delimiters: ['.', '!', '?', ','], min: 8, max: 64}"


def names_task(ir: IR, ref: str) -> bool:
    """Whether a stream's `to` names a task (a node of that name wins: it is a node's stream); the task
    may be an included graph's (`tts.speech.text`)."""
    name = ref.rpartition(".")[0]
    return name not in ir.nodes and (name in ir.doc.data.get("tasks", {}) or name in ir.tasks)


def resolve(ir: IR, name: str, raw: dict[str, Any], policy: tuple[plan.ChunkPolicy, Path]) -> TaskStreamIR:
    """The stream `name` into a task, its ends and policy checked; `policy`: its chunk policy and where."""
    path: Path = ("streams", name)
    task, _, port = raw["to"].rpartition(".")
    source, _, item = raw["from"].partition(".")
    if source != plan.CLIENT:
        raise ir.doc.error(f"stream '{name}' runs into task '{task}', so its text comes from the request's client, "
                           f"not from '{raw['from']}'", (*path, "from"), "write `from: client.text`")
    if port != "text":
        raise ir.doc.error(f"task '{task}' takes streamed text as `{task}.text`, not `{raw['to']}`", (*path, "to"),
                           "each clause becomes the text input of one request of the task")
    chunks, ppath = policy
    if chunks.kind != "delimited":
        raise ir.doc.error(f"stream '{name}' runs into task '{task}' cut as {chunks.kind}: a task takes whole "
                           "clauses of text", ppath, f"write `{EXAMPLE}`")
    return TaskStreamIR(plan.TaskStream(name, item, task, "text", chunks), path, ppath)


def check(ir: IR) -> None:
    """A task run per clause reads its text from the request and nothing else from the client."""
    for ts in ir.task_streams.values():
        task = ir.tasks[ts.spec.task]
        fed = [t.per_chunk for t in task.tracks if t.per_chunk and ir.streams[t.per_chunk].src_node == plan.CLIENT]
        if fed:
            raise ir.doc.error(f"task '{task.name}' reads client-fed stream '{fed[0]}', so it cannot run once per "
                               f"clause of '{ts.spec.name}'", (*ts.path, "to"),
                               "stream text into a task whose inputs all come with its request")
        walks = {w for track in task.tracks for w in task_walks(track.steps, "text")}
        reads = {i.dtype for i in ir.request_inputs if i.walk in walks}
        if "tokens" not in reads:
            raise ir.doc.error(f"task '{task.name}' reads no text from its request, so stream '{ts.spec.name}' "
                               "has nothing to feed", (*ts.path, "to"),
                               f"its walks read {', '.join(sorted(reads)) or 'no request input'}")

